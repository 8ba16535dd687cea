"""`run.violation_routes`: a processor's own onViolation route, and the caller's per-processor map."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from procmesh_orchestrator.run import violation_routes

ENTRY = {"processorId": "moderation", "message": "Content flagged", "detail": {"categories": ["hate"]}}


def test_a_callable_route_gets_the_violation_and_its_exception_is_swallowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[dict[str, Any]] = []
    violation_routes.deliver(got.append, ENTRY, "a", "run-1")
    assert got == [ENTRY]

    def boom(entry: dict[str, Any]) -> None:
        raise RuntimeError("alerting is down")

    with caplog.at_level(logging.ERROR):
        violation_routes.deliver(boom, ENTRY, "a", "run-1")  # never raises into the run
    assert "onViolation callback raised (ignored)" in caplog.text


def test_the_log_route_names_processor_agent_and_run(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=violation_routes.__name__):
        violation_routes.deliver("log", ENTRY, "a", "run-1")
    assert caplog.messages == ["violation of moderation (agent a, run run-1): Content flagged"]


def test_the_caller_s_map_calls_only_the_violation_s_processor() -> None:
    mine: list[str] = []
    others: list[str] = []
    callbacks = {"moderation": lambda v: mine.append(v["message"]), "pii-detector": others.append}
    violation_routes.for_caller(callbacks, ENTRY)
    violation_routes.for_caller(callbacks, {**ENTRY, "processorId": "regex-filter"})
    assert (mine, others) == (["Content flagged"], [])
    every: list[dict[str, Any]] = []
    violation_routes.for_caller(every.append, ENTRY)  # one callable: every violation
    assert every == [ENTRY]
