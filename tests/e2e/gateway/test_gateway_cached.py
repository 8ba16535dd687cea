"""The verdict cache's answers at the gateway, end to end: a real orchestrator process with
``judgeCache`` on, called over gRPC with Generate and GenerateBatch.

A question asked before is answered at once, as the call that asked it was answered (its verdict,
its model, no usage), counted as ever (``ok``, a ``memory`` lookup, a call saved by the cache), and
logged at DEBUG (``outcome=ok cached``): no model was asked, and such calls are most of a guarded
turn's. A call that asked a model keeps its INFO line. With tracing on, each call keeps its
gateway span and its verdict cache span (``memory`` for the answers reused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from tests.e2e.gateway.judge import VERDICT
from tests.e2e.gateway.support import GATEWAY_KEY, KEYS, gateway_calls, judge_calls_saved
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.test_tracing import CALLER_SPAN, TRACE_ID, otel_env, receiver, spans_of
from tests.integration.service.support import AUTH
from tests.integration.service.test_lifecycle import eventually

__all__ = ["receiver"]

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

METADATA = (("authorization", f"Bearer {GATEWAY_KEY}"),)
TENANT_KEY = "tenant-a-key-0123456789"
CONFIG = {
    "models": {
        "main": {"provider": "scripted", "responses": [{"text": "fine"}]},
        "allow": {"provider": "scripted", "responses": [{"text": '{"allowed": true}'}] * 8},
    },
    "agents": {"plain": {"model": "main"}},
    "judgeCache": {"enabled": True},
}


def _call(text: str) -> mpb.ModelServiceGenerateRequest:
    request = mpb.ModelServiceGenerateRequest(
        model="allow", messages=[mpb.ModelMessage(role="user", text=text)], processor_id="g", temperature=0
    )
    request.schema.CopyFrom(convert.to_struct(VERDICT))
    return request


def _memory_lookups(orchestrator: OrchestratorProcess) -> float:
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "procmesh_judge_cache_lookups_total" and sample.labels["result"] == "memory"
    )


async def _ask(
    orchestrator: OrchestratorProcess, metadata: tuple[tuple[str, str], ...] = METADATA
) -> list[mpb.ModelServiceGenerateResponse]:
    """A question judged, asked again alone, then in a batch three times beside a new one: the
    answers in that order (the batch's by index)."""
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = mgrpc.ModelServiceStub(channel)
        first = await stub.Generate(_call("hello"), timeout=10, metadata=metadata)
        again = await stub.Generate(_call("hello"), timeout=10, metadata=metadata)
        items = [mpb.ModelServiceGenerateBatchItem(request=_call(t)) for t in ("hello", "new", "hello")]
        items.append(mpb.ModelServiceGenerateBatchItem(request=_call("hello"), timeout_seconds=5))
        batch = mpb.ModelServiceGenerateBatchRequest(items=items)
        answers = [a async for a in stub.GenerateBatch(batch, timeout=10, metadata=metadata)]
    assert all(a.code == 0 for a in answers), answers
    return [first, again, *(a.response for a in sorted(answers, key=lambda a: a.index))]


def _lines(orchestrator: OrchestratorProcess) -> list[str]:
    text = orchestrator.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if "model gateway model='allow'" in line]


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
async def test_a_question_asked_before_is_answered_counted_and_logged_at_debug(
    level: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    orchestrator = await asyncio.to_thread(
        start_orchestrator, CONFIG, "--log-level", level, env={"PROCMESH_API_KEYS": KEYS}
    )
    answers = await _ask(orchestrator)
    first, again, hello, new, hello2, hello3 = answers
    for answer in answers:
        assert convert.from_value(answer.object) == {"allowed": True}
        assert (answer.model, answer.text) == (first.model, first.text)
    assert min(first.usage.total_tokens, new.usage.total_tokens) > 0  # asked the model
    for reused in (again, hello, hello2, hello3):
        assert not reused.HasField("usage")
        assert reused.attempts == first.attempts
    assert gateway_calls(orchestrator)[("allow", "other", "ok")] == 6
    assert _memory_lookups(orchestrator) == 4
    assert judge_calls_saved(orchestrator, "cache") == 4

    def logged() -> bool:
        return len(_lines(orchestrator)) == (6 if level == "DEBUG" else 2)

    await eventually(logged)
    lines = _lines(orchestrator)
    asked = [line for line in lines if " INFO " in line]
    assert len(asked) == 2, lines
    assert not any("cached" in line for line in asked), lines
    cached = [line for line in lines if " DEBUG " in line]
    assert len(cached) == (4 if level == "DEBUG" else 0), lines
    assert all("processor='g' run='' outcome=ok cached " in line for line in cached), lines
    assert any(line.endswith("(deadline 5.000s)") for line in cached) == (level == "DEBUG")  # its own


async def test_with_tracing_a_question_asked_before_keeps_its_spans(
    receiver: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    env = {"PROCMESH_API_KEYS": KEYS, **otel_env(receiver, "cached")}
    orchestrator = await asyncio.to_thread(start_orchestrator, CONFIG, env=env)
    parent = ("traceparent", f"00-{TRACE_ID}-{CALLER_SPAN}-01")
    answers = await _ask(orchestrator, (*METADATA, parent))
    assert [a.HasField("usage") for a in answers] == [True, False, False, True, False, False]

    def exported() -> list[dict[str, Any]]:
        spans = spans_of(receiver, {"cached"}, ("cached", "procmesh.model_gateway allow"))
        return [s for s in spans if s["service"] == "cached"]

    await eventually(lambda: len(exported()) >= 12)
    spans = exported()
    gateways = {s["spanId"] for s in spans if s["name"] == "procmesh.model_gateway allow"}
    lookups = [s for s in spans if s["name"] == "procmesh.judge_cache other"]
    assert len(gateways) == 6
    assert all(s["parentSpanId"] in gateways for s in lookups)
    results = sorted(s["attributes"]["procmesh.judge_cache.result"] for s in lookups)
    assert results == ["memory"] * 4 + ["miss"] * 2


async def test_a_question_asked_before_is_still_refused_where_it_would_be(
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> None:
    """The verdict cache answers at once only a call the gateway would serve: a caller its keys
    do not let in, or a batch item whose timeout is not above 0, is refused as before the question
    was cached (never handed the verdict)."""
    keys = f"{KEYS},{TENANT_KEY}=tenant-a"
    orchestrator = await asyncio.to_thread(start_orchestrator, CONFIG, env={"PROCMESH_API_KEYS": keys})
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = mgrpc.ModelServiceStub(channel)
        assert (await stub.Generate(_call("hello"), timeout=10, metadata=METADATA)).usage.total_tokens > 0
        assert not (await stub.Generate(_call("hello"), timeout=10, metadata=METADATA)).HasField("usage")
        tenant = (("authorization", f"Bearer {TENANT_KEY}"),)  # a key without the gateway role
        for metadata, code in [
            (tenant, grpc.StatusCode.PERMISSION_DENIED),
            ((("authorization", "Bearer not-a-key-0123456789"),), grpc.StatusCode.UNAUTHENTICATED),
            ((), grpc.StatusCode.UNAUTHENTICATED),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(_call("hello"), timeout=10, metadata=metadata)
            assert refused.value.code() == code
            batch = mpb.ModelServiceGenerateBatchRequest(
                items=[mpb.ModelServiceGenerateBatchItem(request=_call("hello"))]
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [a async for a in stub.GenerateBatch(batch, timeout=10, metadata=metadata)]
            assert refused.value.code() == code
        no_time = mpb.ModelServiceGenerateBatchItem(request=_call("hello"), timeout_seconds=0)
        batch = mpb.ModelServiceGenerateBatchRequest(items=[no_time])
        (item,) = [a async for a in stub.GenerateBatch(batch, timeout=10, metadata=METADATA)]
    assert (item.code, item.HasField("response")) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], False)
    assert item.message == "items.0.timeout_seconds: above 0, got 0.0"
    assert judge_calls_saved(orchestrator, "cache") == 1
