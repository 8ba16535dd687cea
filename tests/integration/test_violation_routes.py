"""The seeds' per-processor ``onViolation`` (SEED-GAPS F1) and the guards' ``errorStrategy`` (M9).

A lane entry's ``onViolation`` routes that processor's violations, in every run: a webhook gets
the regex filter's (a real `builtins` sidecar process), the log the cost control's; the caller's
`CallOptions.on_violation` given per processor id gets only those of the ids it names."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import Agent, CallOptions, violation_routes

PER_CALL = 0.005
ANSWER = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}


@pytest.fixture(params=[204])
def webhook(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server recording the JSON bodies POSTed to it, answering each with the
    parametrized status (204 unless a test asks for another)."""
    received: list[dict[str, Any]] = []
    status: int = request.param

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/violations", received
    server.shutdown()
    server.server_close()
    thread.join()


def _config(tmp_path: Path, url: str) -> Any:
    return parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(tmp_path / "cost.db")},
            "models": {"main": {"provider": "scripted", "responses": [ANSWER] * 10}},
            "prices": {"main": {"input": 0.0, "output": 1000.0}},
            "agents": {
                "a": {
                    "model": "main",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [
                        {
                            "processor": "builtins/regex-filter",
                            "options": {
                                "rules": [{"name": "secret", "pattern": "swordfish"}],
                                "strategy": "warn",
                                "phase": "input",
                            },
                            "onViolation": {"webhook": url},
                        },
                        {
                            "processor": "token-cost-control",
                            "options": {"max_cost": PER_CALL, "strategy": "warn", "reserve_output_tokens": 5},
                            "onViolation": "log",
                        },
                    ],
                }
            },
        }
    )


async def test_each_processor_s_violations_reach_its_own_route(
    tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    url, posted = webhook
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.run.violation_routes")
    mine: list[dict[str, Any]] = []
    async with App(_config(tmp_path, url)) as app:
        options = CallOptions(resource_id="acme", on_violation={"regex-filter": mine.append})
        results = [await app.agent("a").generate("the password is swordfish", options) for _ in range(2)]
        await violation_routes.flush()  # the posts run in the background, never holding a run up
    assert [r.status for r in results] == ["success", "success"]
    # the second run starts at its limit: the cost control warns (strategy warn)
    assert [sorted(v["processorId"] for v in r.violations) for r in results] == [
        ["regex-filter"],
        ["regex-filter", "token-cost-control"],
    ]
    assert [(p["processorId"], p["runId"], p["agentId"]) for p in posted] == [
        ("regex-filter", r.run_id, "a") for r in results
    ]
    assert posted[0]["detail"]["strategy"] == "warn"
    logged = [r.getMessage() for r in caplog.records if r.name == violation_routes.__name__]
    assert len(logged) == 1
    assert logged[0].startswith("violation of token-cost-control (agent a, run ")
    assert [v["processorId"] for v in mine] == ["regex-filter", "regex-filter"]


@pytest.mark.parametrize("webhook", [503], indirect=True)
async def test_a_webhook_that_fails_is_logged_and_counted(
    tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    """The run never waits on its webhook, so a failing one is no failure of the run: each
    violation it did not take is logged and counted, for an alert on the alerting path itself."""
    url, posted = webhook
    async with App(_config(tmp_path, url)) as app:
        results = [await app.agent("a").generate("the password is swordfish") for _ in range(2)]
        await violation_routes.flush()
        failed = app.metrics.total(
            "procmesh_violation_routes_failed_total", agent="a", processor="regex-filter"
        )
    assert [r.status for r in results] == ["success", "success"]
    assert len(posted) == 2  # the webhook got them, and answered 503
    assert failed == 2
    assert caplog.text.count(f"onViolation webhook {url} failed for regex-filter") == 2


def test_two_routes_for_one_instance_are_refused(tmp_path: Path) -> None:
    entry = {"processor": "builtins/regex-filter", "onViolation": "log"}
    cfg = {
        "agents": {
            "a": {
                "model": "demo",
                "inputProcessorsByContext": {
                    "key": "tier",
                    "cases": {"gold": [entry]},
                    "default": [entry | {"onViolation": {"webhook": "http://127.0.0.1:1/"}}],
                },
            }
        }
    }
    with pytest.raises(ConfigError, match="routes its violations otherwise at"):
        parse_config(cfg)


@pytest.mark.parametrize("key", ["errorStrategy", "error_strategy"])
def test_error_strategy_points_at_on_failure(key: str) -> None:
    entry = {"processor": "builtins/moderation", key: "warn"}
    with pytest.raises(ConfigError, match="errorStrategy is onFailure here: onFailure: fail-open for"):
        parse_config({"agents": {"a": {"model": "demo", "inputProcessors": [entry]}}})


async def test_a_callers_callback_that_raises_is_logged_and_counted(
    tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    """A per-call `CallOptions.on_violation` that raises never fails the run: each violation it
    did not take is logged and counted, as a route's failure is."""

    def broken(entry: dict[str, Any]) -> None:
        raise RuntimeError("the caller's bug")

    url, posted = webhook
    async with App(_config(tmp_path, url)) as app:
        options = CallOptions(on_violation={"regex-filter": broken})
        results = [await app.agent("a").generate("the password is swordfish", options) for _ in range(2)]
        await violation_routes.flush()
        failed = app.metrics.total(
            "procmesh_violation_routes_failed_total", agent="a", processor="regex-filter"
        )
    assert [r.status for r in results] == ["success", "success"]
    assert len(posted) == 2  # the entry's own webhook took them (204): only the callback failed
    assert failed == 2
    assert caplog.text.count("onViolation callback raised (ignored)") == 2


async def test_a_callable_route_that_raises_is_logged_and_counted(
    tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    """In the Python API a processor's route may be a callable (`AgentSpec.violation_routes`): one
    that raises never fails the run, each violation it did not take is logged and counted."""

    def broken(entry: dict[str, Any]) -> None:
        raise RuntimeError("the route's bug")

    url, _ = webhook
    async with App(_config(tmp_path, url)) as app:
        spec = app.agent("a").spec
        agent = Agent(dataclasses.replace(spec, violation_routes={"regex-filter": broken}), app.metrics)
        results = [await agent.generate("the password is swordfish") for _ in range(2)]
        failed = app.metrics.total(
            "procmesh_violation_routes_failed_total", agent="a", processor="regex-filter"
        )
    assert [r.status for r in results] == ["success", "success"]
    assert [v["processorId"] for v in results[0].violations] == ["regex-filter"]
    assert failed == 2
    assert caplog.text.count("onViolation callback raised (ignored)") == 2
