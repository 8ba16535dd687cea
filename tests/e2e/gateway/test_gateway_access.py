"""The model gateway is for sidecars only, serves only the config's models, is metered by cost
control, and keeps caller text out of its metric labels and log lines (issue 24, finding 6).

A real orchestrator process serves the gateway on its gRPC port and on ``--grpc-socket``; a real
gRPC client calls it on both; the models are an OpenAI-compatible fake on a real socket, whose key
only the orchestrator holds. Keys: a tenant key (bound to a resource), a key with the ``gateway``
role, and an ``operator`` key (which reads /metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from tests.e2e.gateway.support import GATEWAY_KEY, KEYS, gateway_calls, judge_calls_saved
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import FakeOpenAI
from tests.integration.service.support import API_KEY, AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

PROVIDER_SECRET = "sk-gateway-provider-secret"
TENANT_KEY = "tenant-key-0123456789"
ANSWER = {"text": "ok", "usage": [10, 5]}
CALL_COST = 0.005
"""A call to fake/metered: 5 output tokens at 1000 per million (input is free)."""


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(api_key=PROVIDER_SECRET)
    fake.start()
    for model in ("judge", "metered", "shared", "tenanted"):
        fake.script(model, ANSWER)
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def gateway_socket(sidecar_dir: Path) -> Path:
    return sidecar_dir / "orchestrator.sock"


def _config(provider: FakeOpenAI) -> dict[str, Any]:
    return {
        "providers": {"fake": {"kind": "openai", "baseUrl": provider.base_url, "apiKeyEnv": "FAKE_KEY"}},
        "models": {"main": {"provider": "scripted", "responses": [{"text": "fine"}] * 5}},
        "prices": {
            "main": {"input": 0, "output": 0},
            **{f"fake/{m}": {"input": 0, "output": 1000} for m in ("metered", "shared", "tenanted")},
        },
        "agents": {
            # fake/judge is named as a fallback model; fake/metered by the capped agent, whose
            # limit fits two calls (each reserves 5 output tokens)
            "plain": {"model": [{"model": "main"}, {"model": "fake/judge"}], "errorProcessorDefaults": False},
            "capped": {
                "model": [{"model": "main"}, {"model": "fake/metered"}],
                "errorProcessorDefaults": False,
                "costControl": {"maxCost": 2 * CALL_COST, "scope": "agent", "reserveOutputTokens": 5},
            },
            # one global ledger, two limits: the strictest holds a call outside a run
            **{
                name: {
                    "model": [{"model": "main"}, {"model": "fake/shared"}],
                    "errorProcessorDefaults": False,
                    "costControl": {
                        "maxCost": calls * CALL_COST,
                        "scope": "global",
                        "reserveOutputTokens": 5,
                    },
                }
                for name, calls in (("strict", 1), ("loose", 10))
            },
            "per-tenant": {
                "model": [{"model": "main"}, {"model": "fake/tenanted"}],
                "errorProcessorDefaults": False,
                "costControl": {"maxCost": CALL_COST, "scope": "resource", "reserveOutputTokens": 5},
            },
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    provider: FakeOpenAI,
    gateway_socket: Path,
    tmp_path_factory: pytest.TempPathFactory,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    config = _config(provider)
    config["storage"] = {"path": str(tmp_path_factory.mktemp("ledger") / "memory.db")}
    return await asyncio.to_thread(
        start_orchestrator,
        config,
        "--grpc-socket",
        str(gateway_socket),
        env={"PROCMESH_API_KEYS": f"{KEYS},{TENANT_KEY}=tenant-a", "FAKE_KEY": PROVIDER_SECRET},
    )


def _request(model: str, processor: str = "judge", run_id: str = "") -> mpb.ModelServiceGenerateRequest:
    return mpb.ModelServiceGenerateRequest(
        model=model,
        messages=[mpb.ModelMessage(role="user", text="hi")],
        processor_id=processor,
        run_id=run_id,
    )


async def _call(target: str, request: Any, key: str | None, method: str = "Generate") -> Any:
    """One call of `method` (Generate): the response, or the AioRpcError it was refused with."""
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            call = getattr(mgrpc.ModelServiceStub(channel), method)
            return await call(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc


def _metrics(orchestrator: OrchestratorProcess) -> str:
    return httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text


def _series(text: str) -> set[str]:
    """Every sample line's name and labels (one per series)."""
    return {line.rpartition(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


async def test_a_tenant_key_is_refused_on_the_grpc_port(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI
) -> None:
    refused = await _call(orchestrator.grpc_address, _request("fake/judge"), TENANT_KEY)
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'gateway' role" in (refused.details() or "")
    assert provider.calls("judge") == []
    unauthenticated = await _call(orchestrator.grpc_address, _request("fake/judge"), None)
    assert unauthenticated.code() == grpc.StatusCode.UNAUTHENTICATED
    # refused before the request is read: a body that does not decode gets the same answer
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        raw: Any = channel.unary_unary("/procmesh.v1.ModelService/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as undecodable:
            await raw(b"\xff\xff\xff", metadata=(("authorization", f"Bearer {TENANT_KEY}"),), timeout=5)
    assert undecodable.value.code() == grpc.StatusCode.PERMISSION_DENIED
    calls = await asyncio.to_thread(gateway_calls, orchestrator)
    assert calls[("unknown", "unknown", "permission_denied")] == 2
    assert calls[("unknown", "unknown", "unauthenticated")] == 1


async def test_a_gateway_key_and_an_operator_key_are_served(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI
) -> None:
    for key in (GATEWAY_KEY, API_KEY):
        answer = await _call(orchestrator.grpc_address, _request("fake/judge"), key)
        assert isinstance(answer, mpb.ModelServiceGenerateResponse), answer
        assert (answer.text, answer.model) == ("ok", "fake/judge")
    assert len(provider.calls("judge")) == 2


async def test_any_caller_on_the_unix_socket_is_served(
    orchestrator: OrchestratorProcess, gateway_socket: Path
) -> None:
    for key in (None, TENANT_KEY):
        answer = await _call(f"unix://{gateway_socket}", _request("fake/judge"), key)
        assert isinstance(answer, mpb.ModelServiceGenerateResponse), answer
        assert answer.text == "ok"
    wrong = await _call(f"unix://{gateway_socket}", _request("fake/judge"), "not-a-key")
    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED  # a key that is sent is checked


async def test_a_reported_saving_is_counted_under_the_gateways_access_rules(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI
) -> None:
    saved = lambda: judge_calls_saved(orchestrator, "precheck")  # noqa: E731
    report = mpb.ModelServiceReportSavedRequest(processor_id="judge", run_id="r1", count=2)
    before, asked = saved(), len(provider.calls("judge"))
    refused = await _call(orchestrator.grpc_address, report, TENANT_KEY, "ReportSaved")
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    none = mpb.ModelServiceReportSavedRequest(processor_id="judge", count=0)
    invalid = await _call(orchestrator.grpc_address, none, GATEWAY_KEY, "ReportSaved")
    assert invalid.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert saved() == before
    answer = await _call(orchestrator.grpc_address, report, GATEWAY_KEY, "ReportSaved")
    assert isinstance(answer, mpb.ModelServiceReportSavedResponse), answer
    assert saved() == before + 2
    assert len(provider.calls("judge")) == asked  # no model is called


async def test_a_model_the_config_does_not_name_is_refused(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI, gateway_socket: Path
) -> None:
    for target, key in ((orchestrator.grpc_address, GATEWAY_KEY), (f"unix://{gateway_socket}", None)):
        refused = await _call(target, _request("fake/gpt-expensive"), key)
        assert isinstance(refused, grpc.aio.AioRpcError)
        assert refused.code() == grpc.StatusCode.NOT_FOUND
        assert refused.details().startswith("model 'fake/gpt-expensive' is not in the orchestrator's config")
    assert provider.calls("gpt-expensive") == []


async def test_caller_chosen_names_add_no_metric_series(orchestrator: OrchestratorProcess) -> None:
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = mgrpc.ModelServiceStub(channel)
        metadata = (("authorization", f"Bearer {GATEWAY_KEY}"),)

        async def attack(i: int) -> None:
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Generate(_request(f"x/m{i}", f"p{i}", f"r{i}"), metadata=metadata, timeout=10)

        await attack(-1)  # the first unknown name makes the one "other" series
        await asyncio.to_thread(_metrics, orchestrator)  # and the first read its own
        before = await asyncio.to_thread(_metrics, orchestrator)
        for start in range(0, 200, 20):
            await asyncio.gather(*(attack(i) for i in range(start, start + 20)))
    after = await asyncio.to_thread(_metrics, orchestrator)
    assert _series(after) == _series(before)
    counted = [line for line in after.splitlines() if line.startswith("procmesh_gateway_calls_total{")]
    assert any('model="other",outcome="not_in_config",processor="other"' in line for line in counted), counted
    assert not any("x/m" in line for line in counted)


async def test_a_newline_in_caller_text_stays_in_one_escaped_log_line(
    orchestrator: OrchestratorProcess,
) -> None:
    forged = "\nFORGED ERROR procmesh_orchestrator: forged-by-the-caller"
    refused = await _call(
        orchestrator.grpc_address,
        _request(f"fake/judge{forged}", f"judge{forged}", f"run{forged}"),
        GATEWAY_KEY,
    )
    assert refused.code() == grpc.StatusCode.NOT_FOUND
    assert "\n" not in refused.details()
    for _ in range(100):
        lines = [line for line in orchestrator.log().splitlines() if "forged-by-the-caller" in line]
        if lines:
            break
        await asyncio.sleep(0.05)
    assert len(lines) == 1, lines
    assert lines[0].count("\\nFORGED") == 3  # model, processor and run, each escaped
    assert not any(line.startswith("FORGED") for line in orchestrator.log().splitlines())


async def test_cost_control_caps_direct_gateway_calls(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI, gateway_socket: Path
) -> None:
    # No run: the calls count against the limit of the agent naming the model (scope agent),
    # over TCP and over the socket alike; the limit fits two
    targets = [(orchestrator.grpc_address, GATEWAY_KEY), (f"unix://{gateway_socket}", None)] * 3
    outcomes = [await _call(target, _request("fake/metered"), key) for target, key in targets]
    admitted = [o for o in outcomes if isinstance(o, mpb.ModelServiceGenerateResponse)]
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(admitted) == 2, outcomes
    assert {o.code() for o in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert refused[0].details() == "Cost control: estimated cost limit exceeded (0.01/0.01)"
    assert len(provider.calls("metered")) == 2
    # the same ledger: the agent's own run is refused too
    tenant = {"Authorization": f"Bearer {TENANT_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=tenant, timeout=30) as http:
        body = (await http.post("/api/agents/capped/generate", json={"messages": "hello"})).json()
    assert body["tripwire"]["processorId"] == "token-cost-control", body


async def test_agents_sharing_a_ledger_hold_a_direct_call_to_the_strictest_limit(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI
) -> None:
    outcomes = [
        await _call(orchestrator.grpc_address, _request("fake/shared"), GATEWAY_KEY) for _ in range(3)
    ]
    codes = [o.code() if isinstance(o, grpc.aio.AioRpcError) else "ok" for o in outcomes]
    assert codes == ["ok", grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(provider.calls("shared")) == 1


async def test_a_resource_scope_limits_a_direct_call_by_the_resource_of_its_key(
    orchestrator: OrchestratorProcess, provider: FakeOpenAI, gateway_socket: Path
) -> None:
    socket = f"unix://{gateway_socket}"
    as_tenant = [await _call(socket, _request("fake/tenanted"), TENANT_KEY) for _ in range(2)]
    assert isinstance(as_tenant[0], mpb.ModelServiceGenerateResponse), as_tenant
    assert as_tenant[1].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # no resource: as for a run without one, a resource scope does not limit the call (counted
    # as unlimited in procmesh_cost_admissions_total)
    for target, key in ((socket, None), (orchestrator.grpc_address, GATEWAY_KEY)):
        answer = await _call(target, _request("fake/tenanted"), key)
        assert isinstance(answer, mpb.ModelServiceGenerateResponse), answer
    assert len(provider.calls("tenanted")) == 3
    text = await asyncio.to_thread(_metrics, orchestrator)
    assert 'procmesh_cost_admissions_total{agent="per-tenant",outcome="unlimited"} 2.0' in text
