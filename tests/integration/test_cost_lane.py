"""Cost control as the reference places it (issue 28, SEED-GAPS N1, N2, N6, N8): a
``token-cost-control`` entry in an input lane (``cost-guard`` and the Python `CostGuardProcessor`
its alias), each of the reference's scopes, the structuring model's calls in the spend and an
unpriced model counted by its tokens with one warning; against an in-process App on a real SQLite
store."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator import CostGuardProcessor, TokenCostControl
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.types import StructuredOutput

PER_CALL = 0.005
"""What one scripted call costs: 5 output tokens at 1000 per million (input tokens are free)."""
ANSWER = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}
PRICE = {"input": 0.0, "output": 1000.0}


def _config(tmp_path: Path, entry: Any, *, responses: list[Any] | None = None, **agent: Any) -> Any:
    return parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(tmp_path / "cost.db")},
            "models": {
                "main": {"provider": "scripted", "responses": responses or [ANSWER] * 40},
                "struct": {"provider": "scripted", "responses": [ANSWER | {"text": '{"n": 1}'}] * 10},
                "free": {"provider": "scripted", "responses": [ANSWER | {"text": '{"n": 1}'}] * 10},
            },
            "prices": {"main": PRICE, "struct": PRICE},
            "tools": {"lookup": {"description": "Look it up.", "result": {"found": True}}},
            "agents": {
                "a": {"model": "main", "errorProcessorDefaults": False, "inputProcessors": [entry], **agent}
            },
        }
    )


def _limit(calls: int, scope: str) -> dict[str, Any]:
    return {"max_cost": calls * PER_CALL, "scope": scope, "reserve_output_tokens": 5}


SAME_AND_OTHER = {
    "resource": (CallOptions(resource_id="acme"), CallOptions(resource_id="globex")),
    "thread": (
        CallOptions(resource_id="acme", thread_id="t1"),
        CallOptions(resource_id="acme", thread_id="t2"),
    ),
    "user": (CallOptions(request_context={"userId": "ada"}), CallOptions(request_context={"userId": "bob"})),
    "organization": (
        CallOptions(request_context={"organizationId": "acme"}),
        CallOptions(request_context={"organizationId": "globex"}),
    ),
    "session": (
        CallOptions(request_context={"sessionId": "s1"}),
        CallOptions(request_context={"sessionId": "s2"}),
    ),
}
"""Per scope: two calls of one scope id, and a call of another."""


@pytest.mark.parametrize("scope", sorted(SAME_AND_OTHER))
async def test_the_lane_entry_blocks_a_scope_over_its_budget(tmp_path: Path, scope: str) -> None:
    entry = {"processor": "token-cost-control", "options": _limit(2, scope)}
    same, other = SAME_AND_OTHER[scope]
    async with App(_config(tmp_path, entry)) as app:
        agent = app.agent("a")
        results = [await agent.generate("hi", same) for _ in range(3)]
        assert [r.status for r in results] == ["success", "success", "tripwire"]
        tripwire = results[2].tripwire
        assert tripwire is not None
        assert tripwire["processorId"] == "token-cost-control"
        assert tripwire["metadata"]["scope"] == scope
        assert tripwire["metadata"]["scopeKey"].startswith(f"{scope}:")
        assert (await agent.generate("hi", other)).status == "success"  # its own budget
        # without the scope's id the run is not limited by it (the reference skips it too)
        if scope in ("user", "organization", "session"):
            assert (await agent.generate("hi", CallOptions())).status == "success"


async def test_the_run_scope_counts_the_calls_of_one_run(tmp_path: Path) -> None:
    # each run calls the tool, then answers: two model calls; the limit fits one
    calls = [{"toolCalls": [{"name": "lookup", "args": {}}], "usage": ANSWER["usage"]}, ANSWER]
    entry = {"processor": "token-cost-control", "options": _limit(1, "run")}
    async with App(_config(tmp_path, entry, responses=calls * 5, tools=["lookup"])) as app:
        first = await app.agent("a").generate("hi", CallOptions(resource_id="acme"))
        assert first.status == "tripwire", first.error
        assert first.tripwire is not None
        assert first.tripwire["metadata"]["scopeKey"] == f"run:{first.run_id}"
        assert len(first.steps) == 1  # the tool step ran; the answer's call was refused
        second = await app.agent("a").generate("hi", CallOptions(resource_id="acme"))
        assert len(second.steps) == 1  # a new run, a new budget: its first call went through


@pytest.mark.parametrize(
    "entry",
    [
        {"processor": "cost-guard", "options": _limit(1, "resource")},
        CostGuardProcessor(**_limit(1, "resource")),
        TokenCostControl(**_limit(1, "resource")),
    ],
    ids=["yaml-cost-guard", "python-CostGuardProcessor", "python-TokenCostControl"],
)
async def test_the_alias_is_the_same_processor(tmp_path: Path, entry: Any) -> None:
    async with App(_config(tmp_path, entry)) as app:
        options = CallOptions(resource_id="acme")
        statuses = [(await app.agent("a").generate("hi", options)) for _ in range(2)]
        assert [r.status for r in statuses] == ["success", "tripwire"]
        assert statuses[1].tripwire is not None
        assert statuses[1].tripwire["processorId"] == "token-cost-control"


def test_the_python_class_checks_its_options_as_it_is_made() -> None:
    with pytest.raises(ValueError, match="max_cost"):
        TokenCostControl(max_cost=0)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        (
            {"costControl": {"maxCost": 1}},
            "give costControl or a token-cost-control entry (inputProcessors.0), not both",
        ),
        (
            {"inputProcessors": [], "outputProcessors": ["token-cost-control"]},
            "agents.a.outputProcessors.0: token-cost-control goes in an agent's inputProcessors",
        ),
        ({"inputProcessors": ["token-cost-control", "cost-guard"]}, "token-cost-control is listed 2 times"),
        (
            {"inputProcessors": [{"processor": "token-cost-control", "timeout": 1}]},
            "takes only options and onViolation, not timeout",
        ),
    ],
)
def test_a_misplaced_entry_is_refused_naming_it(tmp_path: Path, agent: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _config(tmp_path, {"processor": "token-cost-control", "options": {"max_cost": 1}}, **agent)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_cost": 0}, "inputProcessors.0.options.max_cost: Input should be greater than 0"),
        ({"max_cost": 1, "scope": "planet"}, "inputProcessors.0.options.scope: Input should be 'run', "),
        (
            {"max_cost": 1, "max_steps": 2},
            "inputProcessors.0.options.max_steps: Extra inputs are not permitted",
        ),
    ],
)
def test_a_bad_option_is_refused_naming_the_entry(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _config(tmp_path, {"processor": "token-cost-control", "options": options})


def test_the_agent_s_model_needs_a_price(tmp_path: Path) -> None:
    entry = {"processor": "token-cost-control", "options": {"max_cost": 1}}
    cfg = {"agents": {"a": {"model": "demo", "inputProcessors": [entry]}}}
    with pytest.raises(
        ConfigError, match=re.escape("agents.a.token-cost-control: model 'demo' has no price")
    ):
        parse_config(cfg)


async def test_a_lane_function_cannot_lift_the_budget(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"processor": "token-cost-control", "options": {"max_cost": 1}})
    without = cfg.agents["a"].model_copy(update={"input_processors": []})
    cfg = cfg.model_copy(update={"agents": {"a": without}})
    async with App(cfg, lanes={"a": {"input": lambda ctx: ["token-cost-control"]}}) as app:
        with pytest.raises(ConfigError, match="goes in the agent's inputProcessors in the config"):
            await app.agent("a").generate("hi")


async def test_a_structuring_call_adds_to_the_spend(tmp_path: Path) -> None:
    entry = {"processor": "token-cost-control", "options": _limit(2, "resource")}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    async with App(_config(tmp_path, entry)) as app:
        options = CallOptions(resource_id="acme", structured_output=StructuredOutput(schema, model="struct"))
        structured = await app.agent("a").generate("hi", options)
        assert structured.status == "success"
        assert structured.object == {"n": 1}
        # the answer's call and the structuring call spent the two calls' budget
        refused = await app.agent("a").generate("hi", CallOptions(resource_id="acme"))
        assert refused.tripwire is not None
        assert refused.tripwire["metadata"]["usage"]["estimatedCost"] == pytest.approx(2 * PER_CALL)


async def test_an_unpriced_model_counts_by_tokens_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = {"processor": "token-cost-control", "options": _limit(5, "resource")}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.run.framework.cost")
    async with App(_config(tmp_path, entry)) as app:
        options = CallOptions(resource_id="acme", structured_output=StructuredOutput(schema, model="free"))
        for _ in range(2):
            assert (await app.agent("a").generate("hi", options)).status == "success"
        warnings = [r.getMessage() for r in caplog.records if "'free' has no price" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "count by tokens only" in warnings[0]
        tokens = app.metrics.cost_unpriced_tokens
        assert tokens.labels("a", "free", "input")._value.get() == 20
        assert tokens.labels("a", "free", "output")._value.get() == 10
        assert app.metrics.cost_admissions.labels("a", "unpriced")._value.get() == 2
