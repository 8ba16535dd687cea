"""Issue 13 on the SDK server: bad input is a short INVALID_ARGUMENT, no hook stalls the sidecar.

Real servers on 127.0.0.1:0. Undecodable requests (defect 5), a CPU-bound or never-ending hook
(defect 2) and where the metrics listener binds (defect 6).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh import SERVICE_NAME, Processor, ProcessorServer, convert, settings_from_args
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

TIMEOUT = 5.0
BURN_LIMIT = 20.0
"""A burning hook's own safety stop, should the test never release it."""


class Burner(Processor):
    """process_input computes in pure Python (never awaiting) until the test releases it."""

    id = "burner"

    def __init__(self) -> None:
        self.burning = threading.Event()
        self.release = threading.Event()

    async def process_input(self) -> None:
        self.burning.set()
        end = time.monotonic() + BURN_LIMIT
        while not self.release.is_set() and time.monotonic() < end:
            sum(i * i for i in range(2000))


class Sleeper(Processor):
    """Hooks that await forever; records that their finally blocks ran (they were cancelled)."""

    id = "sleeper"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finished: list[str] = []
        self.done = threading.Event()

    async def _forever(self, hook: str) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.finished.append(hook)
            self.done.set()

    async def process_input(self) -> None:
        await self._forever("process_input")

    async def process_output_stream(self, part: Any) -> Any:
        await self._forever("process_output_stream")


class Plain(Processor):
    """An ordinary processor hosted beside the others."""

    id = "plain"

    async def process_input(self, messages: list[Any]) -> list[Any]:
        return messages


def context(processor_id: str) -> tpb.RunContext:
    return tpb.RunContext(processor_id=processor_id, run_id="run-1", agent_id="agent-1")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ProcessorServer]:
    async with ProcessorServer([Burner(), Sleeper(), Plain()], ["127.0.0.1:0"]) as srv:
        yield srv


@pytest_asyncio.fixture
async def channel(server: ProcessorServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.addresses[0]) as chan:
        yield chan


def processor(server: ProcessorServer, processor_id: str) -> Any:
    return server._hosted[processor_id].processor


async def health(channel: grpc.aio.Channel, timeout: float) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout)
    return int(resp.status)


def raw_unary(channel: grpc.aio.Channel, rpc: str) -> Any:
    return channel.unary_unary(f"/{SERVICE_NAME}/{rpc}")


def method(channel: grpc.aio.Channel, rpc: str, request: type[Any], response: type[Any]) -> Any:
    return channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


# -- defect 5: undecodable requests -----------------------------------------------------------

GARBAGE = b"\xff\xff\xff\xff\x0f secret-marker"
UNARY_RPCS = [
    "Describe",
    *(rpc for rpc in ppb.DESCRIPTOR.services_by_name["ProcessorService"].methods_by_name),
]


@pytest.mark.parametrize("rpc", sorted(set(UNARY_RPCS) - {"ProcessOutputStream"}))
async def test_an_undecodable_request_is_invalid_argument_with_a_short_message(
    channel: grpc.aio.Channel, rpc: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    code, details = await status_of(raw_unary(channel, rpc)(GARBAGE, timeout=TIMEOUT))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid procmesh.v1." in details
    assert len(details) < 300
    assert_no_content_above_debug(caplog, "secret-marker")


async def test_an_undecodable_stream_request_is_invalid_argument(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    call: Any = channel.stream_stream(f"/{SERVICE_NAME}/ProcessOutputStream")(timeout=TIMEOUT)
    await call.write(GARBAGE)
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid procmesh.v1.ProcessOutputStreamRequest" in (await call.details() or "")
    assert_no_content_above_debug(caplog, "secret-marker")


def nested_struct(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        value = {"k": value}
    return value


async def test_nesting_beyond_the_decoder_limit_is_invalid_argument(channel: grpc.aio.Channel) -> None:
    # ~40 Struct levels are over protobuf's 100-level decoding limit (each Struct level is 3).
    req = ppb.ProcessInputRequest(context=context("plain"))
    req.context.state.update(nested_struct(40))
    call = raw_unary(channel, "ProcessInput")(req.SerializeToString(), timeout=TIMEOUT)
    assert (await status_of(call))[0] == grpc.StatusCode.INVALID_ARGUMENT


async def test_invalid_utf8_in_a_string_is_invalid_argument(channel: grpc.aio.Channel) -> None:
    wire = ppb.ProcessInputRequest(
        context=context("plain"), messages=[tpb.Message(id="MARK")]
    ).SerializeToString()
    broken = wire.replace(b"MARK", b"\xed\xa0\x80M")  # a UTF-16 surrogate encoded as UTF-8: invalid
    call = raw_unary(channel, "ProcessInput")(broken, timeout=TIMEOUT)
    assert (await status_of(call))[0] == grpc.StatusCode.INVALID_ARGUMENT


async def test_refusals_log_one_warning_per_interval_with_a_count(
    channel: grpc.aio.Channel, server: ProcessorServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(30):
        await status_of(raw_unary(channel, "ProcessInput")(GARBAGE, timeout=TIMEOUT))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # the next one waits 10 s and then says how many were left out
    assert "refused a malformed process_input request" in warnings[0].getMessage()
    assert warnings[0].exc_info is None
    assert server._servicer.rejects.total == 30


def test_a_later_warning_counts_the_refusals_left_out(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from procmesh import _guard

    # the log's own clock, moved by hand: with a 50-ms interval and real time, a pause of the
    # loaded machine between the first five notes gave a second warning
    now = [1000.0]
    monkeypatch.setattr(_guard, "time", SimpleNamespace(monotonic=lambda: now[0]))
    caplog.set_level(logging.WARNING)
    rejects = _guard.RejectLog(interval=60)
    for _ in range(5):
        rejects.note("process_input", "ValueError")
        now[0] += 10  # all five within the interval
    now[0] += 20
    rejects.note("process_input", "ValueError")
    assert [r.getMessage() for r in caplog.records] == [
        "refused a malformed process_input request: ValueError",
        "refused a malformed process_input request: ValueError; 4 more refused since the last warning",
    ]


async def test_a_huge_unknown_processor_id_is_not_echoed(channel: grpc.aio.Channel) -> None:
    call = method(channel, "ProcessInput", ppb.ProcessInputRequest, ppb.ProcessInputResponse)
    code, details = await status_of(
        call(ppb.ProcessInputRequest(context=context("x" * 100_000)), timeout=TIMEOUT)
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "is not hosted here" in details
    assert "(100000 characters)" in details
    assert len(details) < 300


def assert_no_content_above_debug(caplog: pytest.LogCaptureFixture, marker: str) -> None:
    for record in caplog.records:
        if record.levelno > logging.DEBUG:
            assert marker not in record.getMessage()
            assert record.exc_info is None, record.getMessage()


# -- defect 2: hooks do not stall the server --------------------------------------------------


async def test_a_cpu_bound_hook_blocks_neither_health_nor_other_processors(
    server: ProcessorServer, channel: grpc.aio.Channel
) -> None:
    burner = processor(server, "burner")
    call = method(channel, "ProcessInput", ppb.ProcessInputRequest, ppb.ProcessInputResponse)
    burning = asyncio.ensure_future(call(ppb.ProcessInputRequest(context=context("burner")), timeout=60))
    try:
        assert await asyncio.to_thread(burner.burning.wait, TIMEOUT)
        for _ in range(5):
            assert await health(channel, timeout=0.5) == health_pb2.HealthCheckResponse.SERVING
        messages = [convert.message_to_proto({"id": "u1", "role": "user", "content": "hi"})]
        plain = await call(
            ppb.ProcessInputRequest(context=context("plain"), messages=messages), timeout=TIMEOUT
        )
        assert [m.id for m in plain.messages] == ["u1"]
        describe = method(channel, "Describe", ppb.DescribeRequest, ppb.DescribeResponse)
        assert len((await describe(ppb.DescribeRequest(), timeout=0.5)).processors) == 3
        assert not burning.done()
    finally:
        burner.release.set()
    await burning


async def test_a_hook_past_its_deadline_is_cancelled(
    server: ProcessorServer, channel: grpc.aio.Channel
) -> None:
    sleeper = processor(server, "sleeper")
    call = method(channel, "ProcessInput", ppb.ProcessInputRequest, ppb.ProcessInputResponse)
    code, _ = await status_of(call(ppb.ProcessInputRequest(context=context("sleeper")), timeout=0.5))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await asyncio.to_thread(sleeper.done.wait, TIMEOUT)
    assert sleeper.finished == ["process_input"]
    labels = {"processor": "sleeper", "hook": "process_input", "outcome": "cancelled"}
    assert server.registry.get_sample_value("procmesh_sidecar_hook_calls_total", labels) == 1


async def test_a_stream_hook_is_cancelled_when_the_caller_cancels(
    server: ProcessorServer, channel: grpc.aio.Channel
) -> None:
    sleeper = processor(server, "sleeper")
    stream = channel.stream_stream(
        f"/{SERVICE_NAME}/ProcessOutputStream",
        request_serializer=ppb.ProcessOutputStreamRequest.SerializeToString,
        response_deserializer=ppb.ProcessOutputStreamResponse.FromString,
    )
    call = stream(timeout=60)
    part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "hi"}})
    await call.write(
        ppb.ProcessOutputStreamRequest(context=context("sleeper"), parts=[ppb.StreamPart(seq=1, part=part)])
    )
    assert await asyncio.to_thread(sleeper.started.wait, TIMEOUT)
    call.cancel()
    assert await asyncio.to_thread(sleeper.done.wait, TIMEOUT)
    assert sleeper.finished == ["process_output_stream"]


async def test_setup_hooks_and_teardown_run_on_one_loop_that_is_not_the_servers() -> None:
    class Loops(Processor):
        id = "loops"
        seen: ClassVar[list[asyncio.AbstractEventLoop]] = []

        async def setup(self) -> None:
            self.seen.append(asyncio.get_running_loop())

        async def process_input(self) -> None:
            self.seen.append(asyncio.get_running_loop())

        async def teardown(self) -> None:
            self.seen.append(asyncio.get_running_loop())

    async with (
        ProcessorServer([Loops()], ["127.0.0.1:0"]) as srv,
        grpc.aio.insecure_channel(srv.addresses[0]) as chan,
    ):
        call = method(chan, "ProcessInput", ppb.ProcessInputRequest, ppb.ProcessInputResponse)
        await call(ppb.ProcessInputRequest(context=context("loops")), timeout=TIMEOUT)
    assert len(Loops.seen) == 3
    assert len(set(map(id, Loops.seen))) == 1
    assert Loops.seen[0] is not asyncio.get_running_loop()


async def test_hook_threads_off_runs_hooks_inline_on_the_server_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    class Inline(Processor):
        id = "inline"
        seen: ClassVar[list[asyncio.AbstractEventLoop]] = []

        async def process_input(self) -> None:
            self.seen.append(asyncio.get_running_loop())

    srv = ProcessorServer([Inline()], ["127.0.0.1:0"], hook_threads=False)
    async with srv, grpc.aio.insecure_channel(srv.addresses[0]) as chan:
        call = method(chan, "ProcessInput", ppb.ProcessInputRequest, ppb.ProcessInputResponse)
        await call(ppb.ProcessInputRequest(context=context("inline")), timeout=TIMEOUT)
    assert Inline.seen == [asyncio.get_running_loop()]
    assert settings_from_args([]).hook_threads is True
    monkeypatch.setenv("PROCMESH_HOOK_THREADS", "false")
    assert settings_from_args([]).hook_threads is False


# -- defect 6: the metrics listener binds where gRPC binds -----------------------------------


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=TIMEOUT) as resp:
        return str(resp.read().decode())


@pytest.mark.parametrize(
    ("addresses", "metrics_host", "bound"),
    [
        (["127.0.0.1:0"], None, "127.0.0.1"),
        (["localhost:0"], None, "localhost"),
        (["unix://{dir}/m.sock"], None, "127.0.0.1"),
        (["unix://{dir}/m.sock", "0.0.0.0:0"], None, "0.0.0.0"),
        (["127.0.0.1:0"], "0.0.0.0", "0.0.0.0"),
    ],
)
async def test_the_metrics_listener_binds_where_grpc_binds(
    tmp_path: Path, addresses: list[str], metrics_host: str | None, bound: str
) -> None:
    addrs = [a.format(dir=tmp_path) for a in addresses]
    srv = ProcessorServer([Plain()], addrs, metrics_port=0, metrics_host=metrics_host)
    async with srv:
        assert srv.metrics_host == bound
        host, port = srv.metrics_server.server_address[:2]
        assert host == ("127.0.0.1" if bound == "localhost" else bound)
        text = await asyncio.to_thread(scrape, "127.0.0.1", port)
        assert "procmesh_sidecar_hook_calls_total" in text


def test_metrics_host_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from_args([]).metrics_host is None
    assert settings_from_args(["--metrics-host", "0.0.0.0"]).metrics_host == "0.0.0.0"
    monkeypatch.setenv("PROCMESH_METRICS_HOST", "10.0.0.7")
    assert settings_from_args([]).metrics_host == "10.0.0.7"
