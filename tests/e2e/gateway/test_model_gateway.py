"""The model gateway end to end: an orchestrator process serving scripted judge models, and a
Python sidecar process whose processInput asks the gateway for a verdict (`judge.py`).

The sidecar is started with a controlled environment: the gateway's address and a key with the
gateway role, no provider key (the orchestrator holds one, `JUDGE_KEY`). Runs go through the
orchestrator's HTTP API; the gateway's counter is read from its /metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import (
    GATEWAY_KEY,
    KEYS,
    gateway_calls,
    judge_calls_saved,
)
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import AUTH
from tests.integration.service.test_lifecycle import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

PROVIDER_SECRET = "sk-provider-secret-never-in-a-sidecar"
ALLOWED = '{"allowed": true}'

JUDGES = {
    "judge-ok": [{"text": ALLOWED}],
    "judge-no": [{"text": '{"allowed": false}'}],
    "judge-retry": [{"text": "Sure! It is allowed."}, {"text": ALLOWED}],
    "judge-bad-closed": [{"text": "not json"}, {"text": '{"allowed": "yes"}'}],
    "judge-bad-open": [{"text": "not json"}, {"text": "still not json"}],
    "node-ok": [{"text": ALLOWED}],
    "node-no": [{"text": '{"allowed": false}'}],
    "node-bad": [{"text": "not json"}, {"text": "still not json"}],
}


SETTLING = {"processor": "jn/judge", "options": {"model": "node-ok", "settle": "SETTLED"}}
"""The Node judge passes a text holding ``SETTLED`` without asking, and reports the call it saved."""


def _agent(judge: str, on_failure: str = "fail-closed", sidecar: str = "j", **extra: Any) -> dict[str, Any]:
    ref = {"processor": f"{sidecar}/judge", "options": {"model": judge}, "onFailure": on_failure, **extra}
    return {"model": "main", "errorProcessorDefaults": False, "inputProcessors": [ref]}


def _config(sidecar: str, node: str, silent_port: int) -> dict[str, Any]:
    models: dict[str, Any] = {
        "main": {"provider": "scripted", "responses": [{"text": "fine"}] * 20},
        **{name: {"provider": "scripted", "responses": script} for name, script in JUDGES.items()},
    }
    return {
        "sidecars": {"j": {"address": sidecar, "timeout": 10}, "jn": {"address": node, "timeout": 10}},
        # a provider whose key only the orchestrator holds; its server never answers
        "providers": {
            "slow": {
                "kind": "openai",
                "baseUrl": f"http://127.0.0.1:{silent_port}/v1",
                "apiKeyEnv": "JUDGE_KEY",
            }
        },
        "models": models,
        "agents": {
            "ok": _agent("judge-ok"),
            "no": _agent("judge-no"),
            "retry": _agent("judge-retry"),
            "closed": _agent("judge-bad-closed"),
            "open": _agent("judge-bad-open", "fail-open"),
            "missing": _agent("judge-missing"),
            "slow": _agent("slow/judge", timeout=1.0),
            "node-ok": _agent("node-ok", sidecar="jn"),
            "node-no": _agent("node-no", sidecar="jn"),
            "node-bad": _agent("node-bad", sidecar="jn"),
            "node-settled": _agent("node-ok", sidecar="jn") | {"inputProcessors": [SETTLING]},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    judge_sidecar: SidecarProcess,
    node_judge: SidecarProcess,
    gateway_port: int,
    silent_port: int,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    await asyncio.gather(judge_sidecar.wait_ready(), node_judge.wait_ready())
    return await asyncio.to_thread(
        start_orchestrator,
        _config(judge_sidecar.address, node_judge.address, silent_port),
        "--grpc-port",
        str(gateway_port),
        env={"PROCMESH_API_KEYS": KEYS, "JUDGE_KEY": PROVIDER_SECRET},
    )


async def _generate(orchestrator: OrchestratorProcess, agent: str, text: str = "hello") -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post(f"/api/agents/{agent}/generate", json={"messages": text})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _model_calls(orchestrator: OrchestratorProcess, model: str) -> float:
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            wanted = {"model": model, "outcome": "ok"}
            if sample.name == "procmesh_model_calls_total" and sample.labels == wanted:
                return sample.value
    return 0.0


def _environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


async def test_an_allowed_verdict_lets_the_run_through(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "ok")
    assert body["text"] == "fine"
    assert not body.get("tripwire")


async def test_a_refusing_verdict_aborts_the_run(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "no", "something forbidden")
    assert body["tripwire"]["reason"] == "judge: not allowed"
    assert body["tripwire"]["processorId"] == "judge"
    assert body["tripwire"]["metadata"] == {"attempts": 1, "model": "judge-no"}


async def test_an_off_schema_answer_is_retried_once(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "retry")
    assert body["text"] == "fine"
    assert _model_calls(orchestrator, "judge-retry") == 2


async def test_malformed_twice_fails_the_run_under_fail_closed(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "closed")
    assert body["finishReason"] == "error", body
    assert "judge" in body["error"]
    assert _model_calls(orchestrator, "judge-bad-closed") == 2


async def test_malformed_twice_lets_the_run_go_on_under_fail_open(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "open")
    assert body["text"] == "fine"
    assert _model_calls(orchestrator, "judge-bad-open") == 2


async def test_an_unknown_model_fails_the_call(orchestrator: OrchestratorProcess) -> None:
    body = await _generate(orchestrator, "missing")
    assert body["finishReason"] == "error", body
    assert "judge" in body["error"]


async def test_the_gateway_counts_calls_by_model_processor_and_outcome(
    orchestrator: OrchestratorProcess,
) -> None:
    for agent in ("ok", "no", "retry", "closed", "open", "missing"):
        await _generate(orchestrator, agent)  # the scripts are exhausted: "(script exhausted)" is not JSON
    calls = gateway_calls(orchestrator)
    assert calls[("judge-ok", "judge", "ok")] >= 1
    assert calls[("judge-no", "judge", "ok")] >= 1
    assert calls[("judge-retry", "judge", "ok")] >= 1
    assert calls[("judge-bad-closed", "judge", "invalid_output")] >= 1
    assert calls[("judge-bad-open", "judge", "invalid_output")] >= 1
    assert calls[("judge-missing", "judge", "not_found")] >= 1


async def test_the_sidecar_holds_no_provider_key(
    orchestrator: OrchestratorProcess, judge_sidecar: SidecarProcess
) -> None:
    assert judge_sidecar.proc is not None
    environ = await asyncio.to_thread(_environ, judge_sidecar.proc.pid)
    assert PROVIDER_SECRET not in environ
    assert "JUDGE_KEY" not in environ
    orchestrator_env = await asyncio.to_thread(_environ, orchestrator.proc.pid)
    assert PROVIDER_SECRET in orchestrator_env  # the check above is not vacuous


async def test_a_caller_without_the_api_key_is_refused(orchestrator: OrchestratorProcess) -> None:
    import grpc

    from procmesh.v1 import model_pb2 as mpb
    from procmesh.v1 import model_pb2_grpc as mgrpc

    request = mpb.ModelServiceGenerateRequest(
        model="judge-ok", messages=[mpb.ModelMessage(role="user", text="hi")], processor_id="x"
    )
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = mgrpc.ModelServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Generate(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = await stub.Generate(
            request, timeout=5, metadata=(("authorization", f"Bearer {GATEWAY_KEY}"),)
        )
        assert answer.model == "judge-ok"
        assert answer.attempts == 1
        assert not answer.HasField("object")


async def test_a_node_hook_calls_the_gateway_too(orchestrator: OrchestratorProcess) -> None:
    assert (await _generate(orchestrator, "node-ok"))["text"] == "fine"
    refused = await _generate(orchestrator, "node-no")
    assert refused["tripwire"]["reason"] == "judge: not allowed"
    assert refused["tripwire"]["metadata"] == {"attempts": 1, "model": "node-no"}
    failed = await _generate(orchestrator, "node-bad")
    assert failed["finishReason"] == "error", failed
    assert gateway_calls(orchestrator)[("node-bad", "judge", "invalid_output")] == 1


async def test_the_gateway_call_carries_the_hooks_deadline(orchestrator: OrchestratorProcess) -> None:
    # The processor's timeout is 1 s and the provider never answers: the sidecar's gateway call
    # has what is left of the hook's 1 s (not the SDK's 30 s default), so the gateway itself sees
    # its deadline pass. (What shows it is the deadline the gateway logged, not the clock: a run
    # fails at the hook's 1 s either way.)
    body = await _generate(orchestrator, "slow")
    assert body["finishReason"] == "error", body
    # The call ends at that deadline, or just before it when the run, failed at the hook's 1 s,
    # ends first and cancels its question (outcome run_ended): either way within the hook's time.
    line = await _gateway_log_line(orchestrator, "slow/judge")
    deadline = float(line.rpartition("(deadline ")[2].rstrip("s)"))
    assert deadline < 2, line  # the hook's 1 s (gRPC adds a few ms), not the SDK's 30 s default
    assert "outcome=deadline " in line or "outcome=run_ended " in line, line


async def _gateway_log_line(orchestrator: OrchestratorProcess, model: str) -> str:
    """The gateway's log line of its call of `model` (polled: it is written as the call ends)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 5
    while True:
        text = orchestrator.log_path.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if f"model gateway model={model!r}" in ln]
        if lines or loop.time() > until:
            assert lines, f"no gateway log line for {model}"
            return lines[-1]
        await asyncio.sleep(0.05)


async def test_a_node_hook_reports_the_judge_calls_it_saved(orchestrator: OrchestratorProcess) -> None:
    precheck = lambda: judge_calls_saved(orchestrator, "precheck")  # noqa: E731
    before, asked = precheck(), _model_calls(orchestrator, "node-ok")
    assert (await _generate(orchestrator, "node-settled", "SETTLED by its own check"))["text"] == "fine"
    await eventually(lambda: precheck() == before + 1)  # reportSaved sends in the background
    assert _model_calls(orchestrator, "node-ok") == asked  # the judge was not asked


async def test_a_gateway_request_with_a_field_this_contract_lacks_is_invalid_argument(
    orchestrator: OrchestratorProcess,
) -> None:
    """A newer sidecar's field (at the top or inside the judge section) is refused by name, never
    dropped: the model call it shaped would otherwise run without it. Without it the call runs."""
    import grpc

    from procmesh.v1 import model_pb2 as mpb
    from tests.e2e.service.test_strict_bodies import _varint, _with_field

    metadata = (("authorization", f"Bearer {GATEWAY_KEY}"),)
    request = mpb.ModelServiceGenerateRequest(
        model="judge-ok", messages=[mpb.ModelMessage(role="user", text="hi")], processor_id="x"
    )
    section = _with_field(mpb.JudgeSection(content="hi"), 9)
    nested = request.SerializeToString() + _varint((8 << 3) | 2) + _varint(len(section)) + section
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        generate = channel.unary_unary(
            "/procmesh.v1.ModelService/Generate",
            request_serializer=lambda raw: raw,
            response_deserializer=mpb.ModelServiceGenerateResponse.FromString,
        )
        report = channel.unary_unary(
            "/procmesh.v1.ModelService/ReportSaved",
            request_serializer=lambda raw: raw,
            response_deserializer=mpb.ModelServiceReportSavedResponse.FromString,
        )
        saved = mpb.ModelServiceReportSavedRequest(processor_id="x", count=1)
        for call, raw, named in (
            (generate, _with_field(request, 99), "field 99"),
            (generate, nested, "section: field 9"),
            (report, _with_field(saved, 7), "field 7"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(raw, timeout=5, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert named in (refused.value.details() or "")
        answer = await generate(request.SerializeToString(), timeout=5, metadata=metadata)
        assert answer.model == "judge-ok"
