"""Fuzz every ProcessorService RPC of a real SDK server (issue 13): bounded, deterministic.

Raw random bytes, mutated valid requests, deep nesting, invalid UTF-8 and huge values go to every
RPC, the output stream included. Malformed input must get a clear status (INVALID_ARGUMENT, or
NOT_FOUND for an id nobody hosts), never UNKNOWN or INTERNAL from the framework; the server stays
SERVING; nothing above DEBUG in the log carries the input. The server runs on its own thread and
loop so that the tests can be plain hypothesis functions with a blocking channel.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procmesh import SERVICE_NAME, Processor, ProcessorServer, hooks
from procmesh._server import DEFAULT_MAX_MESSAGE_BYTES
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

TIMEOUT = 10.0
CASES = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
}
"""What a malformed or unknown request may get; UNKNOWN and INTERNAL would be the framework's fault."""
RPCS = ["Describe", *(h.rpc for h in hooks.HOOKS if not h.streaming)]
STATUS: collections.Counter[str] = collections.Counter()
"""Status names seen, over the whole module (printed by the last test)."""
CONTENT_FREE = re.compile(
    r"^(refused a malformed \w+ request: (not a valid [\w.]+ \(\d+ bytes\)|\w+)"
    r"(; \d+ more refused since the last warning)?|serving processors .*|metrics on .*)$"
)
"""The only log lines above DEBUG the fuzzing may cause; none of them can carry request content."""


class Everything(Processor):
    """Implements every hook and changes nothing: what reaches a hook must not fail the framework."""

    id = "fuzz"

    async def process_input(self) -> None: ...
    async def process_input_step(self) -> None: ...
    async def process_llm_request(self) -> None: ...
    async def process_llm_response(self) -> None: ...
    async def process_output_stream(self, part: Any) -> Any:
        return part

    async def process_output_step(self) -> None: ...
    async def process_tool_result(self) -> None: ...
    async def process_output_result(self) -> None: ...
    async def process_api_error(self) -> None: ...
    async def execute_tool(self) -> Any:
        return {"ok": True}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.above_debug: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno > logging.DEBUG:
            self.above_debug.append(record)


class Background:
    """A ProcessorServer on its own thread and loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = ProcessorServer([Everything()], ["127.0.0.1:0"])
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Background:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(grace=0), self.loop).result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


@pytest.fixture(scope="module")
def records() -> Iterator[Records]:
    handler = Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # DEBUG lines may carry content: they must still not break anything
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture(scope="module")
def channel(records: Records) -> Iterator[grpc.Channel]:
    with Background() as bg, grpc.insecure_channel(bg.server.addresses[0]) as chan:
        yield chan


def unary(channel: grpc.Channel, rpc: str, payload: bytes) -> grpc.StatusCode:
    try:
        call: Any = channel.unary_unary(f"/{SERVICE_NAME}/{rpc}")
        call(payload, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
    else:
        code = grpc.StatusCode.OK
    STATUS[code.name] += 1
    return code


def stream(channel: grpc.Channel, payloads: list[bytes]) -> grpc.StatusCode:
    call: Any = channel.stream_stream(f"/{SERVICE_NAME}/ProcessOutputStream")
    try:
        for _ in call(iter(payloads), timeout=TIMEOUT):
            pass
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
    else:
        code = grpc.StatusCode.OK
    STATUS[code.name] += 1
    return code


def valid_request(rpc: str, processor_id: str = "fuzz") -> bytes:
    """A well-formed request for `rpc` naming `processor_id`, with a marker string in a message."""
    if rpc == "Describe":
        return ppb.DescribeRequest().SerializeToString()
    message = tpb.Message(id="MARKER-1234", role="user")
    message.content.format = 2
    message.content.parts.add().text.text = "MARKER-text"
    if rpc == "ProcessOutputStream":
        part = ppb.StreamPart(seq=1)
        part.part.type = "text-delta"
        req: Any = ppb.ProcessOutputStreamRequest(parts=[part])
    else:
        req = getattr(ppb, f"{rpc}Request")()
        for field in ("messages", "message_list"):
            if (
                field in req.DESCRIPTOR.fields_by_name
                and req.DESCRIPTOR.fields_by_name[field].message_type is tpb.Message.DESCRIPTOR
            ):
                getattr(req, field).append(message)
    req.context.processor_id = processor_id
    req.context.run_id = "run-1"
    return bytes(req.SerializeToString())


def nested_state(depth: int) -> bytes:
    """A ProcessInput request whose context.state nests `depth` Struct levels (3 protobuf levels each)."""
    req = ppb.ProcessInputRequest()
    req.context.processor_id = "fuzz"
    inner = req.context.state
    for _ in range(depth):
        inner = inner.fields["k"].struct_value
    inner.fields["leaf"].string_value = "x"
    return bytes(req.SerializeToString())


def assert_healthy(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


@CASES
@given(rpc=st.sampled_from(RPCS), payload=st.binary(max_size=512))
def test_raw_bytes_to_every_unary_rpc(channel: grpc.Channel, rpc: str, payload: bytes) -> None:
    assert unary(channel, rpc, payload) in ALLOWED


@CASES
@given(payloads=st.lists(st.binary(max_size=256), min_size=1, max_size=4))
def test_raw_bytes_to_the_stream(channel: grpc.Channel, payloads: list[bytes]) -> None:
    assert stream(channel, payloads) in ALLOWED


@CASES
@given(
    rpc=st.sampled_from([*RPCS, "ProcessOutputStream"]),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.integers(min_value=0, max_value=8),
)
def test_mutated_valid_requests(
    channel: grpc.Channel, rpc: str, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(valid_request(rpc) or b"\x00")  # DescribeRequest is empty on the wire
    for pos, value in flips:
        data[pos % len(data)] = value
    payload = bytes(data[: len(data) - cut])
    code = stream(channel, [payload]) if rpc == "ProcessOutputStream" else unary(channel, rpc, payload)
    assert code in ALLOWED


@CASES
@given(
    rpc=st.sampled_from([*RPCS[1:], "ProcessOutputStream"]),  # DescribeRequest has no string
    bad=st.sampled_from([b"\xed\xa0\x80", b"\xff", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80\x80"]),
)
def test_invalid_utf8_in_strings(channel: grpc.Channel, rpc: str, bad: bytes) -> None:
    wire = valid_request(rpc, processor_id="MARKER-pid")
    for marker in (b"MARKER-pid", b"MARKER-1234", b"MARKER-text"):
        wire = wire.replace(marker, bad + marker[len(bad) :])  # same length: the framing stays valid
    code = stream(channel, [wire]) if rpc == "ProcessOutputStream" else unary(channel, rpc, wire)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@CASES
@given(text=st.text(max_size=64), processor_id=st.one_of(st.just("fuzz"), st.text(min_size=1, max_size=80)))
def test_arbitrary_text_and_ids(channel: grpc.Channel, text: str, processor_id: str) -> None:
    req = ppb.ProcessInputRequest()
    req.context.processor_id = processor_id
    req.messages.add(id=text, role=text).content.parts.add().text.text = text
    req.context.options.fields[text or "k"].string_value = text
    assert unary(channel, "ProcessInput", req.SerializeToString()) in ALLOWED


@pytest.mark.parametrize("depth", [1, 10, 32, 33, 34, 40, 100, 400])
def test_deep_nesting(channel: grpc.Channel, depth: int) -> None:
    code = unary(channel, "ProcessInput", nested_state(depth))
    assert code == (grpc.StatusCode.OK if depth <= 32 else grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024, 4 * 1024 * 1024])
def test_huge_values(channel: grpc.Channel, size: int) -> None:
    req = ppb.ProcessInputRequest()
    req.context.processor_id = "fuzz"
    req.messages.add(id="m" * size, role="user").content.parts.add().text.text = "t" * size
    assert unary(channel, "ProcessInput", req.SerializeToString()) in ALLOWED
    req.context.processor_id = "p" * size  # an unknown huge id: NOT_FOUND, not RESOURCE_EXHAUSTED
    assert unary(channel, "ProcessInput", req.SerializeToString()) == grpc.StatusCode.NOT_FOUND


def test_a_request_over_the_size_limit_is_resource_exhausted(channel: grpc.Channel) -> None:
    req = ppb.ProcessInputRequest()
    req.context.processor_id = "fuzz"
    req.messages.add(id="m", role="user").content.parts.add().text.text = "t" * (
        DEFAULT_MAX_MESSAGE_BYTES + 1
    )
    assert unary(channel, "ProcessInput", req.SerializeToString()) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_server_is_healthy_and_the_log_carries_no_input(channel: grpc.Channel, records: Records) -> None:
    """Runs last in the module: after everything above."""
    assert_healthy(channel)
    offending = [r.getMessage()[:200] for r in records.above_debug if not CONTENT_FREE.match(r.getMessage())]
    assert offending == []
    assert not [r for r in records.above_debug if r.exc_info]
    assert STATUS["UNKNOWN"] == STATUS["INTERNAL"] == 0
    print(f"\nfuzz cases: {sum(STATUS.values())}; statuses: {dict(sorted(STATUS.items()))}")
