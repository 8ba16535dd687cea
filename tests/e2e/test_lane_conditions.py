"""Conditions on the request context richer than equality, against a real sidecar: a lane
entry's or a workflow step's `when` as {key, equals|in|present|matches} (or a list: all hold)
decides once per run whether the redactor runs; unknown condition keys are refused naming them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

MAIL = "mail jane@example.com"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def examples(start_sidecar: Callable[..., SidecarProcess]) -> str:
    proc = start_sidecar("examples", name="cond-examples")
    await proc.wait_ready()
    return proc.address


def make(address: str, workflows: dict[str, Any] | None = None, **agent: Any) -> Any:
    return parse_config(
        {
            "sidecars": {"ex": {"address": address}},
            "models": {"m": {"provider": "scripted", "responses": [{"text": "ok"}] * 40}},
            "workflows": workflows or {},
            "agents": {"a": {"model": "m", "errorProcessorDefaults": False, **agent}},
        }
    )


async def redacted(app: App, context: dict[str, Any]) -> bool:
    await app.agent("a").generate(MAIL, CallOptions(request_context=context))
    model = app.agent("a").spec.model
    assert isinstance(model, ScriptedModel)
    text = " ".join(p["text"] for p in model.requests[-1].prompt[-1]["content"] if p["type"] == "text")
    assert text in (MAIL, "mail [email]")
    return text == "mail [email]"


CASES: list[tuple[Any, list[tuple[dict[str, Any], bool]]]] = [
    (
        {"key": "tier", "in": ["gold", "silver"]},
        [({"tier": "gold"}, True), ({"tier": "silver"}, True), ({"tier": "free"}, False), ({}, False)],
    ),
    ({"key": "pii", "present": True}, [({"pii": None}, True), ({"pii": 0}, True), ({}, False)]),
    ({"key": "pii", "present": False}, [({}, True), ({"pii": 1}, False)]),
    (
        {"key": "region", "matches": "eu-.*"},
        [({"region": "eu-west"}, True), ({"region": "us-eu-1"}, False), ({"region": 7}, False)],
    ),
    ({"key": "n", "equals": 3}, [({"n": 3}, True), ({"n": "3"}, False)]),
    (
        [{"key": "tier", "equals": "gold"}, {"key": "region", "matches": "eu-.*"}],
        [({"tier": "gold", "region": "eu-1"}, True), ({"tier": "gold", "region": "us-1"}, False)],
    ),
]


@pytest.mark.parametrize(("when", "runs"), CASES)
async def test_a_lane_entrys_condition(
    examples: str, when: Any, runs: list[tuple[dict[str, Any], bool]]
) -> None:
    cfg = make(examples, inputProcessors=[{"processor": "ex/pii-redactor", "when": when}])
    async with App(cfg) as app:
        assert [await redacted(app, context) for context, _ in runs] == [want for _, want in runs]


async def test_a_workflow_steps_conditions(examples: str) -> None:
    flow = {
        "steps": [
            {"when": {"key": "tier", "in": ["gold"]}, "then": ["ex/pii-redactor"], "otherwise": []},
            {"processor": "ex/topic-guard", "when": {"key": "tier", "present": True}},
        ]
    }
    cfg = make(examples, {"w": flow}, inputProcessors=["workflow:w"])
    async with App(cfg) as app:
        assert await redacted(app, {"tier": "gold"})
        assert not await redacted(app, {"tier": "free"})


@pytest.mark.parametrize(
    ("when", "error"),
    [
        ({"key": "tier", "in": ["a"], "oneOf": 1}, "unknown condition key(s) 'oneOf'"),
        ({"key": "tier"}, "give exactly one of equals, in, present, matches (got none)"),
        ({"key": "tier", "in": "gold"}, "when.in: a list of the values that pass"),
        ({"key": "tier", "present": "yes"}, "when.present: true"),
        ({"key": "r", "matches": "("}, "when.matches: not a regular expression"),
        ([{"tier": "gold"}], "when.0: a condition {key: NAME, OP: VALUE}"),
    ],
)
async def test_a_malformed_condition_is_refused_naming_it(when: Any, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        make("127.0.0.1:1", inputProcessors=[{"processor": "ex/pii-redactor", "when": when}])
    assert "agents.a.inputProcessors.0.when" in str(info.value)
    assert error in str(info.value)


async def test_a_condition_where_none_runs_is_a_start_up_error(examples: str) -> None:
    cfg = make(
        examples, errorProcessors=[{"processor": "ex/pii-redactor", "when": {"key": "x", "present": True}}]
    )
    with pytest.raises(
        ConfigError, match=r"errorProcessors\.0\.when: a condition goes on an input or output"
    ):
        async with App(cfg):
            pass
