"""A limit mapped from a request-context key, ``{fromContext: KEY, cases: {VALUE: X}, default: D}``
(issue 26 item 5), over a real in-process sidecar: a processor option and costControl's maxCost
follow the run's resource (``resourceId``, which no caller can set) or any other key; the caller's
own value is never the limit; each case is checked at start-up against the published schema."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from procmesh import ProcessorServer
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import CallOptions
from tests.integration.service.test_context_options import Budget

PER_CALL = 0.005
"""5 output tokens at 1000 per million."""


def _config(address: str, db: Path, limit: Any, max_cost: Any = 1.0) -> Any:
    answer = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}
    return parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(db)},
            "sidecars": {"s": {"address": address}},
            "models": {"m": {"provider": "scripted", "responses": [answer] * 20}},
            "prices": {"m": {"input": 0.0, "output": 1000.0}},
            "agents": {
                "a": {
                    "model": "m",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [{"processor": "s/budget", "options": {"limit": limit}}],
                    "costControl": {"maxCost": max_cost, "reserveOutputTokens": 5},
                }
            },
        }
    )


@contextlib.asynccontextmanager
async def _app(db: Path, limit: Any, max_cost: Any = 1.0) -> AsyncIterator[App]:
    async with contextlib.AsyncExitStack() as stack:
        sidecar = await stack.enter_async_context(ProcessorServer([Budget()], ["127.0.0.1:0"]))
        yield await stack.enter_async_context(App(_config(sidecar.addresses[0], db, limit, max_cost)))


async def _limit(app: App, resource: str, context: dict[str, Any]) -> Any:
    result = await app.agent("a").generate("hi", CallOptions(resource_id=resource, request_context=context))
    (violation,) = result.violations
    return violation["detail"]["limit"]


async def test_an_option_follows_the_resource_and_never_the_callers_value(tmp_path: Path) -> None:
    limit = {"fromContext": "resourceId", "cases": {"acme": 7, "globex": 9}, "default": 100}
    async with _app(tmp_path / "c.db", limit) as app:
        assert await _limit(app, "acme", {}) == 7
        assert await _limit(app, "globex", {"resourceId": "acme"}) == 9  # the run's, not the caller's
        assert await _limit(app, "initech", {}) == 100
        assert await _limit(app, "", {}) == 100


async def test_a_case_maps_any_key_and_an_unlisted_value_gets_the_default(tmp_path: Path) -> None:
    limit = {"fromContext": "plan", "cases": {"pro": 50}, "default": 10}
    async with _app(tmp_path / "c.db", limit) as app:
        assert await _limit(app, "u", {"plan": "pro"}) == 50
        assert await _limit(app, "u", {"plan": "9999"}) == 10  # never the caller's value itself


async def test_each_case_is_checked_at_start_up(tmp_path: Path) -> None:
    limit = {"fromContext": "resourceId", "cases": {"acme": 0}, "default": 10}
    where = r"agents\.a\.inputProcessors\.0\.options\.limit\.cases\.acme: "
    with pytest.raises(ConfigError, match=where):
        async with _app(tmp_path / "c.db", limit):
            pass


async def test_the_cost_limit_follows_the_resource(tmp_path: Path) -> None:
    max_cost = {"fromContext": "resourceId", "cases": {"acme": PER_CALL}, "default": 1.0}
    async with _app(tmp_path / "c.db", 5, max_cost) as app:
        agent = app.agent("a")
        acme = CallOptions(resource_id="acme")
        assert [(await agent.generate("hi", acme)).status for _ in range(2)] == ["success", "tripwire"]
        globex = CallOptions(resource_id="globex", request_context={"resourceId": "acme"})
        assert [(await agent.generate("hi", globex)).status for _ in range(2)] == ["success"] * 2


@pytest.mark.parametrize(
    ("max_cost", "error"),
    [
        ({"fromContext": "resourceId", "cases": {"acme": 0}, "default": 1}, r"maxCost\.cases\.acme"),
        ({"fromContext": "resourceId", "cases": ["acme"], "default": 1}, r"maxCost\.cases"),
    ],
)
def test_a_bad_cost_case_is_a_config_error(tmp_path: Path, max_cost: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _config("127.0.0.1:1", tmp_path / "c.db", 5, max_cost)
