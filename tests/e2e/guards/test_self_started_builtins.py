"""The built-in sidecar the orchestrator starts itself: no provider key in its environment, and its
guards judge through the orchestrator's model gateway. A real orchestrator process (gRPC on port 0,
then on a unix socket), the `builtins` child it starts, and the scripted judge server that only
the orchestrator holds the key for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.gateway.support import gateway_calls
from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEY, AUTH

pytestmark = pytest.mark.e2e

JUDGE_SECRET = "sk-judge-secret-of-the-orchestrator"
OPENAI_SECRET = "sk-openai-default-provider-secret"  # the built-in `openai` provider's variable
VENDOR_SECRET = "vendor-secret-named-like-an-api-key"
BOUND_KEY = "bound-key-0123456789"
HATE = {"category_scores": [{"category": "hate", "score": 0.9}], "reason": "hateful"}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=JUDGE_SECRET)
    server.start()
    server.judge("mod", {"category_scores": [], "reason": None}, Rule(("HATE",), HATE))
    yield server
    server.stop()


def _config() -> dict[str, Any]:
    """One agent with the built-in moderation guard: no `builtins` sidecar declared, so the
    orchestrator starts one. The judge's baseUrl comes from a PROCMESH_CONFIG__ override."""
    return {
        "providers": {"judges": {"kind": "openai", "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"echo": {"provider": "demo"}},
        "agents": {
            "guarded": {
                "model": "echo",
                "inputProcessors": [
                    {
                        "processor": "builtins/moderation",
                        "options": {"model": "judges/mod", "categories": ["hate"]},
                    }
                ],
            }
        },
    }


def _start(start: Callable[..., OrchestratorProcess], judge: JudgeServer, *args: str) -> OrchestratorProcess:
    return start(
        _config(),
        *args,
        env={
            "PROCMESH_API_KEYS": f"{BOUND_KEY}=user-1,{API_KEY}=@operator",
            "PROCMESH_CONFIG__PROVIDERS__JUDGES__BASE_URL": judge.base_url,
            "JUDGE_KEY": JUDGE_SECRET,
            "OPENAI_API_KEY": OPENAI_SECRET,
            "VENDOR_API_KEY": VENDOR_SECRET,
        },
    )


@pytest.fixture(scope="module")
def orchestrator(
    start_orchestrator: Callable[..., OrchestratorProcess], judge_server: JudgeServer
) -> OrchestratorProcess:
    """Served on TCP only, on a port picked at bind time (``--grpc-port 0``)."""
    return _start(start_orchestrator, judge_server)


def builtins_environ(orchestrator: OrchestratorProcess) -> dict[str, str]:
    """The environment of the orchestrator's `procmesh-sidecar builtins` child."""
    pid = orchestrator.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = [c for c in children if b"procmesh_sidecars\0builtins" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(found) == 1, (children, orchestrator.log())
    raw = Path(f"/proc/{found[0]}/environ").read_bytes()
    return dict(entry.partition("=")[::2] for entry in raw.decode().split("\0") if entry)


def generate(orchestrator: OrchestratorProcess, text: str) -> dict[str, Any]:
    response = httpx.post(
        f"{orchestrator.http_url}/api/agents/guarded/generate",
        json={"messages": text},
        headers=AUTH,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_the_started_builtins_sidecar_holds_no_provider_key(orchestrator: OrchestratorProcess) -> None:
    environ = builtins_environ(orchestrator)
    values = "\0".join(f"{k}={v}" for k, v in environ.items())
    for secret in (JUDGE_SECRET, OPENAI_SECRET, VENDOR_SECRET, BOUND_KEY):
        assert secret not in values
    for name in ("JUDGE_KEY", "OPENAI_API_KEY", "VENDOR_API_KEY", "PROCMESH_API_KEYS"):
        assert name not in environ
    assert not [k for k in environ if k.startswith("PROCMESH_CONFIG__")]
    # what it gets instead: the gateway on loopback and a key made for it (the gateway role only),
    # none of the configured ones
    port = orchestrator.grpc_address.rsplit(":", 1)[1]
    assert environ["PROCMESH_MODEL_GATEWAY"] == f"127.0.0.1:{port}"
    made = environ["PROCMESH_MODEL_GATEWAY_KEY"]
    assert len(made) >= 32
    assert made not in (API_KEY, BOUND_KEY)
    refused = httpx.get(f"{orchestrator.http_url}/api/agents", headers={"Authorization": f"Bearer {made}"})
    assert refused.status_code == 403  # the gateway only: no agent, no data


def test_a_builtin_guard_judges_through_the_gateway(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    before = len(judge_server.calls("mod"))
    blocked = generate(orchestrator, "I HATE them all")
    assert blocked["tripwire"]["processorId"] == "moderation"
    assert blocked["tripwire"]["metadata"]["categories"] == ["hate"]
    passed = generate(orchestrator, "hello there")
    assert "tripwire" not in passed or not passed["tripwire"], passed
    assert "hello there" in passed["text"]
    calls = judge_server.calls("mod")[before:]
    assert [c.headers["authorization"] for c in calls] == [f"Bearer {JUDGE_SECRET}"] * 2
    assert gateway_calls(orchestrator)[("judges/mod", "moderation", "ok")] == 2


def test_with_a_grpc_socket_the_builtins_sidecar_judges_over_it(
    start_orchestrator: Callable[..., OrchestratorProcess],
    judge_server: JudgeServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    socket = tmp_path_factory.mktemp("socket") / "orchestrator.sock"
    orchestrator = _start(start_orchestrator, judge_server, "--grpc-socket", str(socket))
    assert builtins_environ(orchestrator)["PROCMESH_MODEL_GATEWAY"] == f"unix://{socket}"
    blocked = generate(orchestrator, "HATE again")
    assert blocked["tripwire"]["processorId"] == "moderation"
    assert gateway_calls(orchestrator)[("judges/mod", "moderation", "ok")] == 1
