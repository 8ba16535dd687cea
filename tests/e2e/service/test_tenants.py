"""Two tenants of one agent in one `procmesh-orchestrator` process (issue 26, "Done when").

Tenants are API keys bound to resources (``key-acme=acme``, ``key-globex=globex``), and
``PROCMESH_TRUSTED_CONTEXT`` says which request-context keys each may send: acme its plan, token
limit, cost limit and region; globex its plan only. The agent ``assist`` declares its context in
``requestContextSchema`` (``plan`` required; ``region`` not declared) and chooses its input lane by
the resource the caller's API key is bound to (``inputProcessorsByContext`` on ``resourceId``, a
key the server sets and no caller can): acme's runs on the ``acme`` sidecar process (``tagger``
sets ``tier: gold`` in processInput, then ``witness`` records what it saw) with a token limiter
whose ``limit`` comes from the context; globex's on the ``globex`` sidecar process (only
``witness``) with a fixed limiter. ``costControl.maxCost`` maps the resource too
(``{fromContext: resourceId, cases: {acme: 0.02}, default: 1.0}``). Every
run calls the ``whoami`` tool of a third sidecar process, which answers the request context its
ExecuteTool request carried.

What the issue asks, checked on real processes: each tenant's runs go through only its processors
(the two sidecars' own ``/metrics``), a missing required key is a 400 naming it, an undeclared key
and a key the caller may not send are refused naming them, the tagger's value reaches the later
hook and the sidecar tool, and the token and cost limits differ by tenant.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.tools.harness import stats

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ACME = {"Authorization": "Bearer key-acme"}
GLOBEX = {"Authorization": "Bearer key-globex"}
TRUST = {"acme": ["plan", "tokenLimit", "costLimit", "region"], "globex": ["plan"]}
USAGE = {"inputTokens": 10, "outputTokens": 5}
PER_RUN = 0.01
"""Two model calls of 5 output tokens at 1000 per million (input tokens are free)."""
STRICT = {"plan": "strict"}
BASIC = {"plan": "basic"}


def limiter(limit: Any) -> dict[str, Any]:
    return {"processor": "builtins/token-limiter", "options": {"limit": limit}}


def config(acme: str, globex: str, shared: str, db: Path) -> dict[str, Any]:
    schema = {
        "properties": {
            "plan": {"enum": ["strict", "basic"]},
            "tokenLimit": {"type": "integer", "minimum": 1},
            "costLimit": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["plan"],
    }
    lanes = {
        "key": "resourceId",
        "cases": {
            "acme": [
                {"processor": "acme/tagger", "options": {"values": {"tier": "gold"}}},
                "acme/witness",
                limiter({"fromContext": "tokenLimit", "default": 4000}),
            ],
            "globex": ["globex/witness", limiter(4000)],
        },
    }
    step = [{"toolCalls": [{"name": "whoami", "args": {}}], "usage": USAGE}, {"text": "done", "usage": USAGE}]
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "sidecars": {"acme": {"address": acme}, "globex": {"address": globex}, "shared": {"address": shared}},
        "tools": {"whoami": {"sidecar": "shared", "tool": "context"}},
        "models": {"main": {"provider": "scripted", "responses": step * 40}},
        "prices": {"main": {"input": 0.0, "output": 1000.0}},
        "agents": {
            "assist": {
                "model": "main",
                "errorProcessorDefaults": False,
                "tools": ["whoami"],
                "requestContextSchema": schema,
                "inputProcessorsByContext": lanes,
                "costControl": {
                    # by the API key's resource: acme has room for two runs
                    "maxCost": {"fromContext": "resourceId", "cases": {"acme": 2 * PER_RUN}, "default": 1.0},
                    "window": "30d",
                    "reserveOutputTokens": 5,
                },
            }
        },
    }


_METRICS_PORT = re.compile(r"metrics on http://[\d.]+:(\d+)/metrics")


class Sidecar:
    """A tool-sidecar process (tests/fixtures/tool_sidecar.py) and its own metrics port."""

    def __init__(self, proc: SidecarProcess, log: Path) -> None:
        self.proc = proc
        self.address = proc.address
        self.log = log

    def metrics_url(self) -> str:
        deadline = time.monotonic() + 10
        while (found := _METRICS_PORT.search(self.log.read_text(encoding="utf-8"))) is None:
            assert time.monotonic() < deadline, self.log.read_text(encoding="utf-8")
            time.sleep(0.05)
        return f"http://127.0.0.1:{found[1]}/metrics"

    def hook_calls(self) -> dict[tuple[str, str], float]:
        """procmesh_sidecar_hook_calls_total by (processor, hook), from the sidecar's /metrics."""
        text = httpx.get(self.metrics_url()).text
        out: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "procmesh_sidecar_hook_calls_total" and s.value:
                    key = (s.labels["processor"], s.labels["hook"])
                    out[key] = out.get(key, 0.0) + s.value
        return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    sidecar_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, Sidecar]]]:
    sidecars = {}
    for name in ("acme", "globex", "shared"):
        args = ("--metrics-port", "0", "--metrics-host", "127.0.0.1")
        started = start_sidecar(*args, name=f"tenant-{name}", module="tests.fixtures.tool_sidecar")
        sidecars[name] = Sidecar(started, sidecar_dir / f"tenant-{name}.log")
    await asyncio.gather(*(s.proc.wait_ready() for s in sidecars.values()))
    db = tmp_path_factory.mktemp("db") / "tenants.db"
    cfg = config(sidecars["acme"].address, sidecars["globex"].address, sidecars["shared"].address, db)
    env = {
        "PROCMESH_API_KEYS": "key-acme=acme,key-globex=globex",
        "PROCMESH_TRUSTED_CONTEXT": json.dumps(TRUST),
    }
    proc = await asyncio.to_thread(start_orchestrator, cfg, env=env)
    async with httpx.AsyncClient(base_url=proc.http_url, timeout=30) as http:
        yield http, sidecars


async def generate(
    http: httpx.AsyncClient, key: dict[str, str], context: dict[str, Any], text: str = "hi"
) -> httpx.Response:
    return await http.post(
        "/api/agents/assist/generate", headers=key, json={"messages": text, "requestContext": context}
    )


def whoami(body: dict[str, Any]) -> dict[str, Any]:
    """The request context the sidecar tool's ExecuteTool request carried."""
    (result,) = [r for step in body["steps"] for r in step["toolResults"]]
    found: dict[str, Any] = result["payload"]["result"]["requestContext"]
    return found


async def test_each_tenant_gets_its_lane_its_limits_and_only_its_processors(
    fleet: tuple[httpx.AsyncClient, dict[str, Sidecar]],
) -> None:
    http, sidecars = fleet
    # acme's lane, by its key; the tagger's value reaches the later hook and the sidecar tool
    first = await generate(http, ACME, STRICT)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "success", body
    seen = {**STRICT, "tier": "gold"}
    assert whoami(body) == seen
    witnessed = (await stats(sidecars["acme"].address, body["runId"]))["run"]["seen"]
    assert [h["context"] for h in witnessed] == [seen, seen, seen]  # processInput, two steps
    # globex's lane, on its own sidecar; no tagger, so no tier
    other = (await generate(http, GLOBEX, BASIC)).json()
    assert other["status"] == "success", other
    assert whoami(other) == BASIC
    witnessed = (await stats(sidecars["globex"].address, other["runId"]))["run"]["seen"]
    assert [h["context"] for h in witnessed] == [BASIC] * 3

    # token limits: acme's from its context (3 tokens: nothing fits), globex's fixed 4000
    long = "a rather long question " * 20
    squeezed = (await generate(http, ACME, {**STRICT, "tokenLimit": 3}, long)).json()
    assert squeezed["status"] == "tripwire", squeezed
    assert squeezed["tripwire"]["processorId"] == "token-limiter"
    assert (await generate(http, GLOBEX, BASIC, long)).json()["status"] == "success"

    # cost limits: acme's 0.02 (two runs) is spent by its second run; globex's default is 1.0
    second = (await generate(http, ACME, STRICT)).json()
    assert second["status"] == "success", second
    refused = (await generate(http, ACME, STRICT)).json()
    assert refused["status"] == "tripwire", refused
    assert refused["tripwire"]["processorId"] == "token-cost-control"
    assert refused["tripwire"]["metadata"]["maxCost"] == pytest.approx(2 * PER_RUN)
    assert refused["tripwire"]["metadata"]["scopeKey"] == "resource:acme"
    for _ in range(2):  # globex goes past what acme may spend
        assert (await generate(http, GLOBEX, BASIC)).json()["status"] == "success"

    # each sidecar served only its tenant's runs: acme's 4 runs (the 4th refused by cost before
    # its first step, the 3rd by the token limit in it), globex's 4
    acme_calls = sidecars["acme"].hook_calls()
    assert acme_calls == {
        ("tagger", "process_input"): 4,
        ("witness", "process_input"): 4,
        ("witness", "process_input_step"): 2 + 1 + 2 + 1,
    }
    assert sidecars["globex"].hook_calls() == {
        ("witness", "process_input"): 4,
        ("witness", "process_input_step"): 4 * 2,
    }
    assert sidecars["shared"].hook_calls() == {}  # it only hosts the tool


@pytest.mark.parametrize(
    ("key", "context", "message"),
    [
        (ACME, {"costLimit": 0.5}, "requestContext: agent 'assist' requires 'plan'"),
        (ACME, {"plan": "strict", "region": "eu"}, "does not declare 'region'"),
        (GLOBEX, {"plan": "basic", "costLimit": 99}, "this API key may not send 'costLimit'"),
        (ACME, {"plan": "gold"}, "requestContext.plan: 'gold' is not one of ['strict', 'basic']"),
        (GLOBEX, {"plan": "basic", "resourceId": "acme"}, "'resourceId'"),  # acme's lane, by its key
    ],
)
async def test_a_context_the_agent_or_the_deployment_refuses_is_a_400_naming_the_key(
    fleet: tuple[httpx.AsyncClient, dict[str, Sidecar]],
    key: dict[str, str],
    context: dict[str, Any],
    message: str,
) -> None:
    http, sidecars = fleet
    before = sidecars["acme"].hook_calls(), sidecars["globex"].hook_calls()
    response = await generate(http, key, context)
    assert response.status_code == 400, response.text
    assert message in response.text
    assert (sidecars["acme"].hook_calls(), sidecars["globex"].hook_calls()) == before  # nothing ran
