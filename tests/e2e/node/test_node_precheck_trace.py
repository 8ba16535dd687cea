"""A Node hook's span counts the judge calls its own pre-check saved, as a Python hook's does:
``procmesh.judge.precheck_saved`` on its ``procmesh.hook`` span (the Node SDK's
``model(ref).reportSaved(count)``; the Python SDK's ``report_saved``).

A real Node sidecar (tests/e2e/gateway/judge.mjs: a text holding its ``settle`` option passes
unasked, reported as one judge call saved) exports spans to the tests' OTLP/HTTP receiver
(tests/fixtures/otlp_receiver.py); its hook is called over gRPC with a fresh trace context. No
gateway is configured: the report itself is dropped, the span still counts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from procmesh import convert
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
