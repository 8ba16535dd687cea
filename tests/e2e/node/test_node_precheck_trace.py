"""A Node hook's span counts the judge calls its own pre-check saved, as a Python hook's does:
``procmesh.judge.precheck_saved`` on its ``procmesh.hook`` span (the Node SDK's
``model(ref).reportSaved(count)``; the Python SDK's ``report_saved``).

A real Node sidecar (tests/e2e/gateway/judge.mjs: a text holding its ``settle`` option passes
unasked, reported as one judge call saved) exports spans to the tests' OTLP/HTTP receiver
(tests/fixtures/otlp_receiver.py); its hook is called over gRPC with a fresh trace context. No
gateway is configured: the report itself is dropped, the span still counts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.node.conftest import HERE, require_node, wait_all
from tests.e2e.node.test_node_tracing import (
    Receiver,
    assert_child,
    ctx,
    message,
    receiver,
    start_node,
    trace_context,
    traced_env,
    unary,
)

__all__ = ["receiver"]  # the receiver fixture, shared with test_node_tracing.py

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

JUDGE = HERE.parent / "gateway" / "judge.mjs"


@pytest.fixture(scope="module")
def judge(receiver: Receiver, socket_dir: Path) -> Iterator[SidecarProcess]:
    require_node()
    address = f"unix://{socket_dir / 'precheck.sock'}"
    proc = start_node(str(JUDGE), address, socket_dir / "precheck.log", traced_env(receiver))
    try:
        wait_all([proc])
        yield proc
    finally:
        proc.stop(grace=2.0)


async def test_a_node_hooks_span_counts_the_judge_calls_its_precheck_saved(
    judge: SidecarProcess, receiver: Receiver
) -> None:
    trace_id, parent, metadata = trace_context()
    context = ctx("judge")
    context.options.CopyFrom(convert.to_struct({"settle": "SETTLED", "model": "judge"}))
    request = ppb.ProcessInputRequest(context=context, messages=[message("SETTLED by its own check")])
    assert await unary(judge.address, "ProcessInput", request, metadata) == grpc.StatusCode.OK
    [span] = await receiver.wait_for(trace_id)
    assert_child(span, trace_id, parent)
    assert span["name"] == "procmesh.hook process_input judge"
    assert span["attributes"]["procmesh.judge.precheck_saved"] == 1


class _Gateway(mgrpc.ModelServiceServicer):
    """A model gateway that answers every call and keeps each call's ``traceparent``."""

    def __init__(self) -> None:
        self.traceparents: list[str] = []

    async def Generate(self, request: Any, context: Any) -> mpb.ModelServiceGenerateResponse:
        self.traceparents += [v for k, v in context.invocation_metadata() if k == "traceparent"] or [""]
        return mpb.ModelServiceGenerateResponse(text="fine", model=request.model, attempts=1)


async def test_a_node_stream_hooks_gateway_call_carries_its_sessions_trace(
    receiver: Receiver, socket_dir: Path
) -> None:
    """A `processOutputStream` session's span is not active around its parts; the gateway calls
    its parts make carry it all the same (they went without a trace context), so the call sits
    under the sidecar's stream hook span in the caller's trace."""
    require_node()
    gateway = _Gateway()
    server = grpc.aio.server()
    mgrpc.add_ModelServiceServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"unix://{socket_dir / 'stream-judge.sock'}"
    env = traced_env(receiver, PROCMESH_MODEL_GATEWAY=f"127.0.0.1:{port}")
    proc = start_node(str(JUDGE), address, socket_dir / "stream-judge.log", env)
    try:
        await asyncio.to_thread(wait_all, [proc])
        trace_id, _, metadata = trace_context()
        part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "hello"}})
        request = ppb.ProcessOutputStreamRequest(
            context=ctx("judge-stream"), parts=[ppb.StreamPart(seq=1, part=part)]
        )
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream(
                "/procmesh.v1.ProcessorService/ProcessOutputStream",
                request_serializer=ppb.ProcessOutputStreamRequest.SerializeToString,
                response_deserializer=ppb.ProcessOutputStreamResponse.FromString,
            )(metadata=metadata, timeout=10)
            await call.write(request)
            answer = await call.read()
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        assert [r.seq for r in answer.results] == [1]
        (traceparent,) = gateway.traceparents
        assert traceparent, "the gateway call carried no trace context"
        assert traceparent.split("-")[1] == trace_id  # the caller's trace
        [span] = await receiver.wait_for(trace_id)  # the sidecar's session span
        assert span["name"] == "procmesh.hook process_output_stream judge-stream"
        assert traceparent.split("-")[2] == span["spanId"]  # the call is its child
    finally:
        proc.stop(grace=2.0)
        await server.stop(None)
