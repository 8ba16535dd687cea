"""Fuzz every ProcessorService RPC of a real SDK server (issue 13): bounded, deterministic.

Raw random bytes, mutated valid requests, deep nesting, invalid UTF-8 and huge values go to every
RPC, the output stream included. Malformed input must get a clear status (INVALID_ARGUMENT, or
NOT_FOUND for an id nobody hosts), never UNKNOWN or INTERNAL from the framework; the server stays
SERVING; nothing above DEBUG in the log carries the input. The server is a real sidecar process
(`tests.fixtures.fuzz_sidecar`, logging at DEBUG as JSON lines to a file the last test reads), so
the tests can be plain hypothesis functions with a blocking channel: only the blocking gRPC
runtime runs in the test process (an aio server beside it in one process is a mix gRPC does not
support; it once crashed in a collection there).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procmesh import SERVICE_NAME, hooks
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


class Sidecar:
    """`tests.fixtures.fuzz_sidecar` as a child process on a unix socket, its log (DEBUG, JSON lines)
    in a file; started and stopped with blocking calls only."""

    def __init__(self, folder: Path) -> None:
        self.address = f"unix://{folder}/fuzz.sock"
        self.log = folder / "sidecar.log"
        # none of the runner's own PROCMESH_* settings (each would be a start-up line to explain)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}
        env.update(PROCMESH_LOG_LEVEL="DEBUG", PROCMESH_LOG_FORMAT="json")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fixtures.fuzz_sidecar", "--listen", self.address],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def wait_serving(self, channel: grpc.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                check = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1)
                if check.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "the fuzz sidecar did not report SERVING"
            time.sleep(0.05)

    def above_debug(self) -> list[dict[str, Any]]:
        """The log's records above DEBUG (every line is one JSON object)."""
        records = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in records if r["level"] != "DEBUG"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    side = Sidecar(tmp_path_factory.mktemp("fuzz"))
    try:
        yield side
    finally:
        side.stop()


@pytest.fixture(scope="module")
def channel(sidecar: Sidecar) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(sidecar.address) as chan:
        sidecar.wait_serving(chan)
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


def test_the_server_is_healthy_and_the_log_carries_no_input(channel: grpc.Channel, sidecar: Sidecar) -> None:
    """Runs last in the module: after everything above."""
    assert_healthy(channel)
    assert sidecar.proc.poll() is None  # still serving: no input crashed it
    above_debug = sidecar.above_debug()
    assert any(r["message"].startswith("serving processors") for r in above_debug)  # the log is read
    offending = [r["message"][:200] for r in above_debug if not CONTENT_FREE.match(r["message"])]
    assert offending == []
    assert not [r for r in above_debug if "exception" in r]
    assert STATUS["UNKNOWN"] == STATUS["INTERNAL"] == 0
    print(f"\nfuzz cases: {sum(STATUS.values())}; statuses: {dict(sorted(STATUS.items()))}")
