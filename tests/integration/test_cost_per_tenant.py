"""Cost control's limit per tenant (issue 26 item 5): ``maxCost`` and ``scope`` as
``{fromContext: KEY, default: VALUE}`` take each run's value from its request context, against an
in-process App on a real SQLite store; a value that is no limit fails the run before its model
call, naming the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import RequestContextError
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions

PER_CALL = 0.005
"""What one scripted call costs: 5 output tokens at 1000 per million (input tokens are free)."""


def _config(tmp_path: Path, **cost: Any) -> Any:
    answer = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}
    limit = {"maxCost": {"fromContext": "costLimit", "default": 3 * PER_CALL}, "reserveOutputTokens": 5}
    return parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(tmp_path / "cost.db")},
            "models": {"main": {"provider": "scripted", "responses": [answer] * 40}},
            "prices": {"main": {"input": 0.0, "output": 1000.0}},
            "agents": {
                "a": {"model": "main", "errorProcessorDefaults": False, "costControl": {**limit, **cost}}
            },
        }
    )


async def _statuses(app: App, n: int, resource: str, context: dict[str, Any]) -> list[str]:
    options = CallOptions(resource_id=resource, request_context=context)
    return [(await app.agent("a").generate("hi", options)).status for _ in range(n)]


async def test_each_tenant_spends_up_to_its_own_limit(tmp_path: Path) -> None:
    async with App(_config(tmp_path)) as app:
        # acme's context gives it room for one call; globex has none of the key: the default, three
        assert await _statuses(app, 2, "acme", {"costLimit": PER_CALL}) == ["success", "tripwire"]
        assert await _statuses(app, 4, "globex", {}) == ["success"] * 3 + ["tripwire"]
        refused = await app.agent("a").generate(
            "hi", CallOptions(resource_id="acme", request_context={"costLimit": PER_CALL})
        )
        assert refused.tripwire is not None
        assert refused.tripwire["metadata"]["maxCost"] == pytest.approx(PER_CALL)
        # a bigger limit in the context lets acme go on: the ledger is the scope's, the limit the run's
        assert await _statuses(app, 1, "acme", {"costLimit": 1.0}) == ["success"]


async def test_the_scope_comes_from_the_context_too(tmp_path: Path) -> None:
    scope = {"fromContext": "costScope", "default": "resource"}
    async with App(_config(tmp_path, maxCost=2 * PER_CALL, scope=scope)) as app:
        # scoped by agent, two resources share one budget of two calls
        shared = {"costScope": "agent"}
        assert await _statuses(app, 1, "u1", shared) + await _statuses(app, 2, "u2", shared) == [
            "success",
            "success",
            "tripwire",
        ]
        assert await _statuses(app, 2, "u3", {}) == ["success", "success"]


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"costLimit": "lots"},
            "agent 'a': costControl.maxCost (request-context key 'costLimit'): 'lots' is not a number "
            "greater than 0",
        ),
        ({"costLimit": 0}, "costControl.maxCost (request-context key 'costLimit'): 0 is not a number"),
        ({"costLimit": True}, "costControl.maxCost (request-context key 'costLimit'): True is not"),
        (
            {"costScope": "planet"},
            "costControl.scope (request-context key 'costScope'): 'planet' is not one of run, "
            "resource, thread, user, organization, session, agent, global",
        ),
    ],
)
async def test_a_value_that_is_no_limit_fails_the_run_before_its_model_call(
    tmp_path: Path, context: dict[str, Any], message: str
) -> None:
    scope = {"fromContext": "costScope", "default": "resource"}
    async with App(_config(tmp_path, scope=scope)) as app:
        agent = app.agent("a")
        options = CallOptions(resource_id="acme", request_context=context)
        with pytest.raises(RequestContextError, match=re.escape(message)) as info:
            await agent.generate("hi", options)
        assert info.value.keys == [next(iter(context))]
        with pytest.raises(RequestContextError, match=re.escape(message)):
            agent.check_call(options)  # what the APIs call as they admit a request: a 400
        with pytest.raises(RequestContextError, match=re.escape(message)):
            agent.stream("hi", options)
        model = agent.spec.model
        assert isinstance(model, ScriptedModel)
        assert model.requests == []
