"""The orchestrator's own APIs over TLS and mTLS: a real `procmesh-orchestrator` process, real certificates.

With ``--tls-cert/--tls-key/--tls-client-ca`` both APIs speak TLS only and require a certificate the
client CA signed; the sidecars the orchestrator starts itself reach the model gateway on a socket in
a private folder (they hold no CA for its port). Unusable TLS settings stop the start-up, named.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN, REPO
from tests.e2e.service.conftest import NODE, OrchestratorProcess
from tests.fixtures.pki import make_pki
from tests.integration.service.support import API_KEY, API_KEYS, AUTH, GRPC_AUTH, demo_answer, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    pki: dict[str, str],
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    sidecar = start_sidecar("examples", name="tls-guards")
    await sidecar.wait_ready()
    config = service_config({"guards": sidecar.address})
    config["agents"]["assistant"]["errorProcessorDefaults"] = True  # the built-in sidecar is started
    return await asyncio.to_thread(
        start_orchestrator,
        config,
        "--tls-cert",
        pki["server_cert"],
        "--tls-key",
        pki["server_key"],
        "--tls-client-ca",
        pki["ca"],
        env={"PROCMESH_API_KEYS": API_KEYS},
        verify=_client_context(pki),
    )


def _client_context(pki: dict[str, str], *, client: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"])
    if client:
        context.load_cert_chain(pki["client_cert"], pki["client_key"])
    return context


def _channel_credentials(pki: dict[str, str], *, client: bool = True) -> grpc.ChannelCredentials:
    read = lambda key: Path(pki[key]).read_bytes()  # noqa: E731
    return grpc.ssl_channel_credentials(
        root_certificates=read("ca"),
        private_key=read("client_key") if client else None,
        certificate_chain=read("client_cert") if client else None,
    )


async def test_both_apis_serve_tls_to_a_client_with_a_certificate(
    orchestrator: OrchestratorProcess, pki: dict[str, str]
) -> None:
    assert orchestrator.http_url.startswith("https://")
    async with httpx.AsyncClient(
        base_url=orchestrator.http_url,
        headers=AUTH,
        verify=_client_context(pki),
    ) as http:
        response = await http.post("/api/agents/assistant/generate", json={"messages": "hello"})
        assert response.status_code == 200, response.text
        assert response.json()["text"] == demo_answer("hello").replace("Darn", "****")
    async with grpc.aio.secure_channel(orchestrator.grpc_address, _channel_credentials(pki)) as channel:
        result = await agrpc.AgentServiceStub(channel).Generate(
            apb.GenerateRequest(agent_id="assistant", text="jailbreak"), metadata=GRPC_AUTH, timeout=20
        )
        assert result.tripwire.processor_id == "topic-guard"
    assert "(TLS, client certificates required)" in orchestrator.log()


async def test_plaintext_and_callers_without_a_certificate_are_refused(
    orchestrator: OrchestratorProcess, pki: dict[str, str]
) -> None:
    plain = orchestrator.http_url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):  # a TLS port answers no plaintext request
        await asyncio.to_thread(httpx.get, f"{plain}/healthz", timeout=5)
    with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
        await asyncio.to_thread(
            httpx.get,
            f"{orchestrator.http_url}/healthz",
            verify=_client_context(pki, client=False),
            timeout=5,
        )
    async with grpc.aio.secure_channel(
        orchestrator.grpc_address, _channel_credentials(pki, client=False)
    ) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agrpc.AgentServiceStub(channel).Generate(
                apb.GenerateRequest(agent_id="assistant", text="hi"), metadata=GRPC_AUTH, timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agrpc.AgentServiceStub(channel).Generate(
                apb.GenerateRequest(agent_id="assistant", text="hi"), metadata=GRPC_AUTH, timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def _builtin_sidecar_gateway(orchestrator: OrchestratorProcess) -> str:
    """The PROCMESH_MODEL_GATEWAY the orchestrator gave the built-in sidecar it started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"builtins" in cmdline and f"{orchestrator.proc.pid}".encode() in cmdline:
            for variable in environ:
                if variable.startswith(b"PROCMESH_MODEL_GATEWAY="):
                    return variable.split(b"=", 1)[1].decode()
    raise AssertionError("no built-in sidecar of this orchestrator found")


async def test_the_started_sidecars_reach_the_gateway_on_a_private_socket(
    orchestrator: OrchestratorProcess,
) -> None:
    address = _builtin_sidecar_gateway(orchestrator)
    assert address.startswith("unix://"), address
    folder = Path(address.removeprefix("unix://")).parent
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    async with grpc.aio.insecure_channel(address) as channel:  # what the sidecar does: no CA, no key
        answer = await mgrpc.ModelServiceStub(channel).Generate(
            mpb.ModelServiceGenerateRequest(
                model="demo", messages=[mpb.ModelMessage(role="user", text="hi")], processor_id="judge"
            ),
            timeout=10,
        )
    assert answer.text == demo_answer("hi")


def _start_failure(config_path: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [
            str(BIN / "procmesh-orchestrator"),
            "--config",
            str(config_path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--tls-cert", "{server_cert}"), "tls_cert and tls_key go together"),
        (("--tls-client-ca", "{ca}"), "tls_client_ca (mTLS) needs tls_cert"),
        (("--tls-cert", "{server_cert}", "--tls-key", "{missing}"), "PROCMESH_TLS_KEY: cannot read"),
        (
            ("--tls-cert", "{server_cert}", "--tls-key", "{client_key}"),
            "are not a usable certificate and key",
        ),
        (
            ("--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--tls-client-ca", "{config}"),
            "PROCMESH_TLS_CLIENT_CA: ",
        ),
    ],
)
async def test_unusable_tls_settings_stop_the_start_up_naming_them(
    pki: dict[str, str], tmp_path: Path, flags: tuple[str, ...], named: str
) -> None:
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        "models: {demo: {provider: demo}}\nagents: {a: {model: demo, errorProcessorDefaults: false}}\n",
        encoding="utf-8",
    )
    values: dict[str, Any] = {**pki, "missing": str(tmp_path / "absent.key"), "config": str(config_path)}
    code, stderr = await asyncio.to_thread(
        _start_failure, config_path, *(flag.format(**values) for flag in flags)
    )
    assert code == 2, stderr
    assert named in stderr, stderr


async def test_a_sidecar_reaches_the_gateway_over_the_tls_port(
    orchestrator: OrchestratorProcess, pki: dict[str, str]
) -> None:
    """The SDK's model client, configured as a sidecar's settings would (CA and client pair)."""
    from procmesh import _model

    try:
        _model.configure(orchestrator.grpc_address, API_KEY, None)
        with pytest.raises(_model.ModelError):  # plaintext to a TLS port: no answer
            await _model.Model("demo", "judge", "").generate("hi", timeout=5)
        _model.configure(
            orchestrator.grpc_address,
            API_KEY,
            _model.gateway_tls(pki["ca"], pki["client_cert"], pki["client_key"]),
        )
        answer = await _model.Model("demo", "judge", "").generate("hi", timeout=10)
        assert answer.text == demo_answer("hi")
        with pytest.raises(ValueError, match="need PROCMESH_MODEL_GATEWAY_CA"):
            _model.gateway_tls(None, pki["client_cert"], pki["client_key"])
    finally:
        _model.configure(None)


_NODE_GATEWAY_CALL = """
const { Model } = require(process.argv[1]);
new Model('demo', 'judge', '').generate('hi', { timeoutMs: 10000 })
  .then((answer) => console.log(JSON.stringify({ text: answer.text })))
  .catch((err) => console.log(JSON.stringify({ error: err.message })));
"""


@pytest.mark.parametrize("with_ca", [True, False])
async def test_a_node_sidecar_reaches_the_gateway_over_the_tls_port(
    orchestrator: OrchestratorProcess, pki: dict[str, str], with_ca: bool
) -> None:
    """The Node SDK's model client with the same settings as the Python SDK's."""
    tls = (
        {
            "PROCMESH_MODEL_GATEWAY_CA": pki["ca"],
            "PROCMESH_MODEL_GATEWAY_CERT": pki["client_cert"],
            "PROCMESH_MODEL_GATEWAY_CERT_KEY": pki["client_key"],
        }
        if with_ca
        else {}
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [str(NODE), "-e", _NODE_GATEWAY_CALL, str(REPO / "sdk" / "node" / "lib" / "model.js")],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PROCMESH_MODEL_GATEWAY": orchestrator.grpc_address,
            "PROCMESH_MODEL_GATEWAY_KEY": API_KEY,
            **tls,
        },
    )
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    if with_ca:
        assert outcome == {"text": demo_answer("hi")}, done.stderr
    else:
        assert "UNAVAILABLE" in outcome["error"], outcome
