"""A Node SDK sidecar traces like a Python one: OTLP/HTTP spans that continue the caller's trace.

Real Node sidecars (contract.mjs, tools.mjs) run with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at
the tests' OTLP/HTTP receiver (tests/fixtures/otlp_receiver.py). Each call carries a
``traceparent`` of a fresh trace id and parent span id; the receiver must then hold the
sidecar's SERVER span of that trace with that parent, named and attributed as the Python SDK
names them (procmesh.hook, procmesh.processor.id, gen_ai.tool.name, procmesh.outcome) and
nothing else: no user content. With tracing off (no endpoint) the rest of tests/e2e/node runs
the same sidecars unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from procmesh import convert
from procmesh.hooks import HOOKS
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import HERE, node_sidecar, require_node, wait_all

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RECEIVER = HERE.parent.parent / "fixtures" / "otlp_receiver.py"
SERVICE = "procmesh-node-tracing-e2e"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.StatusCode.STATUS_CODE_ERROR
TIMEOUT = 5.0


@dataclass(frozen=True)
class Receiver:
    """The running OTLP/HTTP receiver."""

    endpoint: str

    def spans(self) -> list[dict[str, Any]]:
        lines = httpx.get(f"{self.endpoint}/spans", timeout=5).text.splitlines()
        return [json.loads(line) for line in lines if line]

    async def wait_for(self, trace_id: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The spans of `trace_id`, once at least `count` have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.spans() if s["traceId"] == trace_id]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{len(found)} of {count} spans of trace {trace_id} arrived"
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    port_file = tmp_path_factory.mktemp("otlp") / "port"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), str(port_file)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (port_file.exists() and port_file.read_text()):
            assert proc.poll() is None, f"the OTLP receiver exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the OTLP receiver never wrote its port"
            time.sleep(0.02)
        yield Receiver(f"http://127.0.0.1:{port_file.read_text()}")
    finally:
        proc.terminate()
        proc.wait(5)


def traced_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # milliseconds: spans arrive while the test waits
        **extra,
    }


def start_node(script: str, address: str, log: Path, env: dict[str, str]) -> Any:
    """A Node sidecar started with `env` added to this process's environment."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        return node_sidecar(HERE / script, address, log)


@dataclass(frozen=True)
class Traced:
    contract: str
    tools: str


@pytest.fixture(scope="module")
def traced(receiver: Receiver, socket_dir: Path) -> Iterator[Traced]:
    require_node()
    env = traced_env(receiver)
    contract = start_node(
        "contract.mjs", f"unix://{socket_dir / 'traced.sock'}", socket_dir / "traced.log", env
    )
    tools = start_node(
        "tools.mjs", f"unix://{socket_dir / 'traced-tools.sock'}", socket_dir / "traced-tools.log", env
    )
    try:
        wait_all([contract, tools])
        yield Traced(contract.address, tools.address)
    finally:
        contract.stop(grace=2.0)
        tools.stop(grace=2.0)


def trace_context() -> tuple[str, str, list[tuple[str, str]]]:
    """A fresh trace id, parent span id, and the call metadata carrying them."""
    trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, parent, [("traceparent", f"00-{trace_id}-{parent}-01"), ("tracestate", "vendor=x")]


def ctx(pid: str) -> tpb.RunContext:
    return tpb.RunContext(processor_id=pid, run_id="run-1", agent_id="agent-1")


def message(text: str) -> tpb.Message:
    return convert.message_to_proto(
        {"id": "m1", "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}
    )


async def unary(address: str, rpc: str, request: Any, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await getattr(pgrpc.ProcessorServiceStub(channel), rpc)(
                request, metadata=metadata, timeout=TIMEOUT
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def assert_child(span: dict[str, Any], trace_id: str, parent: str) -> None:
    assert span["traceId"] == trace_id
    assert span["parentSpanId"] == parent
    assert span["service"] == SERVICE
    assert span["kind"] == SERVER_KIND


SECRET = "the user's secret text"

# (processor, rpc, request, the call's status, procmesh.outcome)
HOOK_CASES: list[tuple[str, str, Callable[[], Any], grpc.StatusCode, str]] = [
    (
        "echo",
        "ProcessInput",
        lambda: ppb.ProcessInputRequest(context=ctx("echo"), messages=[message(SECRET)]),
        grpc.StatusCode.OK,
        "rewrite",
    ),
    (
        "echo",
        "ProcessLLMResponse",
        lambda: ppb.ProcessLLMResponseRequest(context=ctx("echo")),
        grpc.StatusCode.OK,
        "pass",
    ),
    (
        "effects",
        "ProcessOutputStep",
        lambda: ppb.ProcessOutputStepRequest(context=ctx("effects"), text=f"{SECRET} forbidden"),
        grpc.StatusCode.OK,
        "retry",
    ),
    (
        "effects",
        "ProcessOutputStep",
        lambda: ppb.ProcessOutputStepRequest(context=ctx("effects"), text=f"{SECRET} default"),
        grpc.StatusCode.OK,
        "abort",
    ),
    (
        "faulty",
        "ProcessInput",
        lambda: ppb.ProcessInputRequest(context=ctx("faulty"), messages=[message(SECRET)]),
        grpc.StatusCode.INTERNAL,
        "failure",
    ),
]


@pytest.mark.parametrize(
    ("pid", "rpc", "request_of", "code", "outcome"), HOOK_CASES, ids=[f"{c[1]}-{c[4]}" for c in HOOK_CASES]
)
async def test_a_hook_call_is_a_server_span_in_the_callers_trace(
    traced: Traced,
    receiver: Receiver,
    pid: str,
    rpc: str,
    request_of: Callable[[], Any],
    code: grpc.StatusCode,
    outcome: str,
) -> None:
    trace_id, parent, metadata = trace_context()
    assert await unary(traced.contract, rpc, request_of(), metadata) == code
    [span] = await receiver.wait_for(trace_id)
    assert_child(span, trace_id, parent)
    hook = next(h.name for h in HOOKS if h.rpc == rpc)
    assert span["name"] == f"procmesh.hook {hook} {pid}"
    # exactly these: ids, names and the outcome, never what the run said
    assert span["attributes"] == {
        "procmesh.hook": hook,
        "procmesh.processor.id": pid,
        "procmesh.outcome": outcome,
    }
    assert (span["status"] == STATUS_ERROR) == (outcome == "failure")


@pytest.mark.parametrize(
    ("tool", "args", "outcome"), [("weather", {"city": SECRET}, "ok"), ("broken", {"city": SECRET}, "error")]
)
async def test_a_hosted_tool_call_is_a_server_span_named_for_the_tool(
    traced: Traced, receiver: Receiver, tool: str, args: dict[str, Any], outcome: str
) -> None:
    trace_id, parent, metadata = trace_context()
    request = ppb.ExecuteToolRequest(
        context=tpb.RunContext(run_id="run-1"), tool_name=tool, tool_call_id="c1"
    )
    request.args.CopyFrom(convert.to_value(args))
    assert await unary(traced.tools, "ExecuteTool", request, metadata) == grpc.StatusCode.OK
    [span] = await receiver.wait_for(trace_id)
    assert_child(span, trace_id, parent)
    assert span["name"] == f"procmesh.hook execute_tool {tool}"
    assert span["attributes"] == {
        "procmesh.hook": "execute_tool",
        "gen_ai.tool.name": tool,
        "procmesh.outcome": outcome,
    }


async def test_a_processors_execute_tool_is_a_hook_span_of_the_processor(
    traced: Traced, receiver: Receiver
) -> None:
    trace_id, parent, metadata = trace_context()
    request = ppb.ExecuteToolRequest(context=ctx("adder"), tool_name="add", tool_call_id="c1")
    request.args.CopyFrom(convert.to_value({"a": 1, "b": 2}))
    assert await unary(traced.tools, "ExecuteTool", request, metadata) == grpc.StatusCode.OK
    [span] = await receiver.wait_for(trace_id)
    assert_child(span, trace_id, parent)
    assert span["name"] == "procmesh.hook execute_tool adder"
    # a result is a rewrite, as the Python SDK's outcome_of reads a response with a field set
    assert span["attributes"] == {
        "procmesh.hook": "execute_tool",
        "procmesh.processor.id": "adder",
        "procmesh.outcome": "rewrite",
    }


def stream_request(pid: str | None, *texts: str, start: int = 1) -> ppb.ProcessOutputStreamRequest:
    req = ppb.ProcessOutputStreamRequest()
    if pid is not None:
        req.context.CopyFrom(ctx(pid))
    for i, text in enumerate(texts):
        req.parts.add(
            seq=start + i,
            part=convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": text}}),
        )
    return req


@pytest.mark.parametrize(
    ("batches", "code", "outcome"),
    [
        ([("a", SECRET), ("b",)], grpc.StatusCode.OK, "pass"),
        ([("a",), ("stop",), ("late",)], grpc.StatusCode.OK, "abort"),
        ([("a",), ("boom",)], grpc.StatusCode.INTERNAL, "failure"),
    ],
    ids=["pass", "abort", "failure"],
)
async def test_an_output_stream_session_is_one_span(
    traced: Traced, receiver: Receiver, batches: list[tuple[str, ...]], code: grpc.StatusCode, outcome: str
) -> None:
    trace_id, parent, metadata = trace_context()
    async with grpc.aio.insecure_channel(traced.contract) as channel:
        call = pgrpc.ProcessorServiceStub(channel).ProcessOutputStream(metadata=metadata, timeout=TIMEOUT)
        try:
            for i, texts in enumerate(batches):
                await call.write(stream_request("censor" if i == 0 else None, *texts, start=1 + 10 * i))
            await call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            pass  # the server ended the stream first (an abort, a failure): the status says
        with contextlib.suppress(grpc.aio.AioRpcError):  # a failure: the status says
            async for _ in call:
                pass
        assert await call.code() == code
    [span] = await receiver.wait_for(trace_id)
    assert_child(span, trace_id, parent)
    assert span["name"] == "procmesh.hook process_output_stream censor"
    assert span["attributes"] == {
        "procmesh.hook": "process_output_stream",
        "procmesh.processor.id": "censor",
        "procmesh.outcome": outcome,
    }
    assert (span["status"] == STATUS_ERROR) == (outcome == "failure")


async def test_a_call_without_a_trace_context_starts_a_trace(traced: Traced, receiver: Receiver) -> None:
    before = {s["spanId"] for s in receiver.spans()}
    request = ppb.ProcessInputRequest(context=ctx("strict"))
    assert await unary(traced.contract, "ProcessInput", request, []) == grpc.StatusCode.OK
    deadline = time.monotonic() + 10
    while not (
        new := [s for s in receiver.spans() if s["spanId"] not in before and s["name"].endswith(" strict")]
    ):
        assert time.monotonic() < deadline, "no span of the untraced call arrived"
        await asyncio.sleep(0.05)
    [span] = new
    assert span["parentSpanId"] == ""
    assert span["attributes"]["procmesh.outcome"] == "pass"


async def test_span_hook_names_are_the_python_sdks() -> None:
    require_node()
    script = (
        "const t = require('./lib/tracing'); const { HOOKS } = require('./lib/hooks');"
        "console.log(JSON.stringify(Object.fromEntries(HOOKS.map((h) => [h.rpc, t.wireHook(h.name)]))))"
    )
    out = subprocess.run(["node", "-e", script], cwd=NODE_SDK, capture_output=True, text=True, check=True)  # noqa: ASYNC221
    assert json.loads(out.stdout) == {h.rpc: h.name for h in HOOKS}


async def test_spans_still_buffered_at_sigterm_are_exported(receiver: Receiver, socket_dir: Path) -> None:
    require_node()
    # a batch delay far beyond the test: only the SIGTERM path's shutdown can export the span
    env = traced_env(receiver, OTEL_BSP_SCHEDULE_DELAY="600000")
    proc = start_node("contract.mjs", f"unix://{socket_dir / 'flush.sock'}", socket_dir / "flush.log", env)
    try:
        await proc.wait_ready()
        trace_id, parent, metadata = trace_context()
        request = ppb.ProcessInputRequest(context=ctx("strict"))
        assert await unary(proc.address, "ProcessInput", request, metadata) == grpc.StatusCode.OK
        await asyncio.sleep(0.3)
        assert not [s for s in receiver.spans() if s["traceId"] == trace_id]
    finally:
        code = proc.stop(grace=10.0)
    assert code == 0
    [span] = await receiver.wait_for(trace_id, timeout=2)
    assert_child(span, trace_id, parent)


async def test_an_unsupported_protocol_leaves_tracing_off_with_one_warning(
    receiver: Receiver, socket_dir: Path
) -> None:
    require_node()
    env = traced_env(receiver, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    log = socket_dir / "grpc-protocol.log"
    proc = start_node("contract.mjs", f"unix://{socket_dir / 'grpc-protocol.sock'}", log, env)
    try:
        await proc.wait_ready()
        trace_id, _, metadata = trace_context()
        request = ppb.ProcessInputRequest(context=ctx("strict"))
        assert await unary(proc.address, "ProcessInput", request, metadata) == grpc.StatusCode.OK
    finally:
        assert proc.stop(grace=5.0) == 0
    warnings = [line for line in log.read_text().splitlines() if "tracing is off" in line]
    assert len(warnings) == 1
    assert "'grpc' is not supported" in warnings[0]
    await asyncio.sleep(0.3)
    assert not [s for s in receiver.spans() if s["traceId"] == trace_id]
