"""ModelService.GenerateBatch end to end: a real orchestrator process, called directly over gRPC and
through a Python and a Node sidecar process whose hook asks about every message at once
(`judge.py`'s and `judge.mjs`'s ``judge-each``, the way the built-in guards ask about a
conversation's history).

Each call of a batch is answered as Generate answers it alone, as soon as it is ready, and fails
alone; the whole batch is refused only for what is wrong with the batch itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.judge import VERDICT
from tests.e2e.gateway.support import GATEWAY_KEY, KEYS, gateway_calls
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.test_strict_bodies import _varint, _with_field
from tests.integration.service.support import AUTH
from tests.integration.service.test_lifecycle import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ALLOWED = '{"allowed": true}'
REFUSED = '{"allowed": false}'
METADATA = (("authorization", f"Bearer {GATEWAY_KEY}"),)


def _agent(
    judge: str, sidecar: str = "j", options: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    ref = {
        "processor": f"{sidecar}/judge-each",
        "options": {"model": judge, **(options or {})},
        "onFailure": "fail-closed",
        **extra,
    }
    return {"model": "main", "errorProcessorDefaults": False, "inputProcessors": [ref]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    judge_sidecar: SidecarProcess,
    node_judge: SidecarProcess,
    gateway_port: int,
    silent_port: int,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    await asyncio.gather(judge_sidecar.wait_ready(), node_judge.wait_ready())
    config = {
        "sidecars": {
            "j": {"address": judge_sidecar.address, "timeout": 10},
            "jn": {"address": node_judge.address, "timeout": 10},
        },
        "providers": {
            "slow": {
                "kind": "openai",
                "baseUrl": f"http://127.0.0.1:{silent_port}/v1",
                "apiKeyEnv": "JUDGE_KEY",
            }
        },
        "models": {
            "main": {"provider": "scripted", "responses": [{"text": "fine"}] * 20},
            "allow": {"provider": "scripted", "responses": [{"text": ALLOWED}] * 64},
            "deny": {"provider": "scripted", "responses": [{"text": REFUSED}] * 64},
        },
        "agents": {
            "each": _agent("allow"),
            "each-denied": _agent("deny"),
            "hung": _agent("slow/judge", timeout=1.0),
            "node-each": _agent("allow", "jn", {"flag": "BAD", "refuse": "deny"}),
            "node-hung": _agent("slow/judge", "jn", timeout=1.0),
        },
    }
    return await asyncio.to_thread(
        start_orchestrator,
        config,
        "--grpc-port",
        str(gateway_port),
        env={"PROCMESH_API_KEYS": KEYS, "JUDGE_KEY": "sk-never-in-a-sidecar"},
    )


def _call(model: str, text: str = "hello") -> mpb.ModelServiceGenerateRequest:
    request = mpb.ModelServiceGenerateRequest(
        model=model,
        messages=[mpb.ModelMessage(role="user", text=text)],
        processor_id="judge-each",
        temperature=0,
    )
    request.schema.CopyFrom(convert.to_struct(VERDICT))
    return request


def _item(model: str, timeout: float | None = None) -> mpb.ModelServiceGenerateBatchItem:
    item = mpb.ModelServiceGenerateBatchItem(request=_call(model))
    if timeout is not None:
        item.timeout_seconds = timeout
    return item


def _batch_sizes(orchestrator: OrchestratorProcess) -> tuple[float, float]:
    """procmesh_gateway_batch_size's count and sum."""
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("procmesh_gateway_batch_size")
    }
    return found["procmesh_gateway_batch_size_count"], found["procmesh_gateway_batch_size_sum"]


async def test_each_call_is_answered_as_it_is_ready_and_fails_alone(
    orchestrator: OrchestratorProcess,
) -> None:
    before = gateway_calls(orchestrator)
    items = [_item("slow/judge", timeout=1.0), _item("allow"), _item("nope"), _item("allow", timeout=0)]
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = mgrpc.ModelServiceStub(channel)
        answers = [
            a
            async for a in stub.GenerateBatch(
                mpb.ModelServiceGenerateBatchRequest(items=items), timeout=10, metadata=METADATA
            )
        ]
        with pytest.raises(grpc.aio.AioRpcError) as alone:  # the same call as a Generate of its own
            await stub.Generate(_call("nope"), timeout=10, metadata=METADATA)
    assert [a.index for a in answers][-1] == 0  # the hung provider's call last, the others before it
    by_index = {a.index: a for a in answers}
    assert sorted(by_index) == [0, 1, 2, 3]
    assert by_index[0].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "did not answer within the call's deadline (1.000s)" in by_index[0].message
    assert by_index[1].code == 0
    assert convert.from_value(by_index[1].response.object) == {"allowed": True}
    assert by_index[1].response.model
    assert by_index[2].code == grpc.StatusCode.NOT_FOUND.value[0]
    assert by_index[2].message == alone.value.details()
    assert by_index[3].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert by_index[3].message.startswith("items.3.timeout_seconds: above 0")
    after = gateway_calls(orchestrator)
    for key, added in {
        ("allow", "judge-each", "ok"): 1,
        ("slow/judge", "judge-each", "deadline"): 1,
        ("other", "judge-each", "not_in_config"): 2,  # the batch's and the Generate alone
    }.items():
        assert after.get(key, 0) - before.get(key, 0) == added, key


async def test_a_batch_that_is_empty_too_big_or_holds_an_unknown_field_is_refused(
    orchestrator: OrchestratorProcess,
) -> None:
    one = _item("allow").SerializeToString()
    request = _call("allow")
    unknown = _with_field(request, 99)
    item = _varint((1 << 3) | 2) + _varint(len(unknown)) + unknown  # items.0.request with field 99
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        batch = channel.unary_stream(
            "/procmesh.v1.ModelService/GenerateBatch",
            request_serializer=lambda raw: raw,
            response_deserializer=mpb.ModelServiceGenerateBatchResponse.FromString,
        )
        for raw, named in (
            (b"", "items: give 1 to 1024 calls, got 0"),
            (b"".join(_varint((1 << 3) | 2) + _varint(len(one)) + one for _ in range(1025)), "got 1025"),
            (_varint((1 << 3) | 2) + _varint(len(item)) + item, "items.0.request: field 99"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [a async for a in batch(raw, timeout=10, metadata=METADATA)]
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert named in (refused.value.details() or "")


async def test_a_hook_asking_about_every_message_sends_one_batch(orchestrator: OrchestratorProcess) -> None:
    count, total = _batch_sizes(orchestrator)
    before = gateway_calls(orchestrator)
    messages = [{"role": "user", "content": f"question {i}"} for i in range(6)]
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/each/generate", json={"messages": messages})
        assert response.status_code == 200, response.text
        assert response.json()["text"] == "fine"
        denied = await http.post("/api/agents/each-denied/generate", json={"messages": messages[:3]})
    assert denied.status_code == 200, denied.text
    assert denied.json()["tripwire"]["reason"] == "judge-each: not allowed: [0, 1, 2]"
    assert _batch_sizes(orchestrator) == (count + 2, total + 9)
    after = gateway_calls(orchestrator)
    assert after[("allow", "judge-each", "ok")] - before.get(("allow", "judge-each", "ok"), 0) == 6
    assert after[("deny", "judge-each", "ok")] - before.get(("deny", "judge-each", "ok"), 0) == 3


async def test_a_hung_batch_fails_the_hook_at_its_deadline(orchestrator: OrchestratorProcess) -> None:
    def ended() -> float:  # at the run's end (the hook failed), the hook's deadline or the calls' own
        calls = gateway_calls(orchestrator)
        outcomes = ("run_ended", "deadline", "cancelled")
        return sum(calls.get(("slow/judge", "judge-each", outcome), 0) for outcome in outcomes)

    before = ended()
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/hung/generate", json={"messages": ["a", "b"]})
    body = response.json()
    assert (body["status"], body["text"]) == ("failed", ""), response.text
    assert body["error"].startswith("processor 'judge-each' failed in process_input: DEADLINE_EXCEEDED")
    await eventually(lambda: ended() - before == 2)  # both calls of the hook's batch ended, none left running


async def test_a_node_hook_asking_about_every_message_sends_one_batch(
    orchestrator: OrchestratorProcess,
) -> None:
    count, total = _batch_sizes(orchestrator)
    before = gateway_calls(orchestrator)
    texts = ["node 0", "node 1 BAD", "node 2", "node 3", "node 4 BAD", "node 5"]
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/node-each/generate", json={"messages": texts})
    assert response.status_code == 200, response.text
    assert response.json()["tripwire"]["reason"] == "judge-each: not allowed: [1, 4]"  # each verdict its own
    assert _batch_sizes(orchestrator) == (count + 1, total + 6)
    after = gateway_calls(orchestrator)
    for key, added in {("allow", "judge-each", "ok"): 4, ("deny", "judge-each", "ok"): 2}.items():
        assert after.get(key, 0) - before.get(key, 0) == added, key


async def test_a_hung_node_batch_fails_the_hook_at_its_deadline(orchestrator: OrchestratorProcess) -> None:
    def ended() -> float:  # the Node hook's callers gone at its deadline: the batch call cancelled
        calls = gateway_calls(orchestrator)
        outcomes = ("run_ended", "deadline", "cancelled")
        return sum(calls.get(("slow/judge", "judge-each", outcome), 0) for outcome in outcomes)

    before = ended()
    count, total = _batch_sizes(orchestrator)
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/node-hung/generate", json={"messages": ["a", "b"]})
    body = response.json()
    assert (body["status"], body["text"]) == ("failed", ""), response.text
    assert body["error"].startswith("processor 'judge-each' failed in process_input: DEADLINE_EXCEEDED")
    assert _batch_sizes(orchestrator) == (count + 1, total + 2)
    await eventually(lambda: ended() - before == 2)  # both calls of the hook's batch ended, none left running
