"""A run's recorded inputs stay within `decisions.maxInputBytes`: past it, one ``truncated`` mark
and nothing more; an agent that does not record inputs keeps none."""

from __future__ import annotations

import json
from typing import Any

import pytest

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.processors.decisions import DecisionLog, DecisionsConfig


class Store:
    def __init__(self) -> None:
        self.saved: list[Any] = []

    async def save_decisions(self, decisions: Any, *, retention_seconds: float, inputs: Any = ()) -> None:
        self.saved = list(inputs)


async def _kept(log: DecisionLog) -> list[Any]:
    store = Store()

    async def get() -> Store:
        return store

    log.add(("a", "s", "p", "p"), "process_input", 0, "pass")  # something to write
    await log.flush("r", "a", "", "", get)  # type: ignore[arg-type]
    return store.saved


async def test_inputs_past_the_size_bound_leave_one_mark() -> None:
    log = DecisionLog(DecisionsConfig(record=True, max_input_bytes=40), inputs=True)
    log.keep("input", 0, "hello")
    log.keep("model-output", 0, [{"type": "text-delta", "payload": {"text": "x" * 50}}])
    log.keep("model-output", 1, "more")
    kept = await _kept(log)
    assert [(i.kind, i.step) for i in kept] == [("input", 0), ("truncated", 0)]
    assert json.loads(kept[1].body) == {"kind": "model-output", "maxInputBytes": 40}


async def test_an_agent_not_recording_inputs_keeps_none() -> None:
    log = DecisionLog(DecisionsConfig(record=True))
    log.keep("input", 0, "hello")
    assert await _kept(log) == []


def test_recording_inputs_without_the_decision_record_is_refused_by_name() -> None:
    agents = {"a": {"model": "demo", "recordInputs": True}}
    with pytest.raises(ConfigError, match=r"agents \['a'\] set recordInputs, which needs decisions.record"):
        parse_config({"agents": agents}, "test")
    assert parse_config({"agents": agents, "decisions": {"record": True}}, "test").agents["a"].record_inputs
