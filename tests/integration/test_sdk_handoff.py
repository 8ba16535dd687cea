"""The SDK's idle hand-off (issue 32): a quick hook runs without a thread wake-up, on the server's
thread, while its loop's thread is idle; a CPU-bound hook still never stalls health or other calls.

A real sidecar process (`tests.fixtures.handoff_sidecar`) over gRPC on a unix socket. Each hook
answers with the thread it ran on and its running loop, so the tests read where it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh import SERVICE_NAME, Processor, convert
from procmesh.errors import ProcmeshError
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator import SidecarProcess

SERVER_THREAD = "MainThread"
"""`procmesh.run` serves on the process's main thread."""


@contextlib.asynccontextmanager
async def sidecar(folder: Path, **env: str) -> AsyncIterator[grpc.aio.Channel]:
    """The fixture sidecar on a unix socket in `folder`, with `env` added to its environment."""
    address = f"unix://{folder}/handoff.sock"
    proc = SidecarProcess(
        [],
        address,
        module="tests.fixtures.handoff_sidecar",
        env={**os.environ, "HANDOFF_DIR": str(folder), **env},
    )
    proc.start()
    try:
        await proc.wait_ready()
        async with grpc.aio.insecure_channel(address) as chan:
            yield chan
    finally:
        proc.stop()


@pytest_asyncio.fixture
async def channel(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    async with sidecar(tmp_path) as chan:
        yield chan


async def where(channel: grpc.aio.Channel, processor_id: str, **options: Any) -> tuple[str, str]:
    """Call `processor_id`'s processInput: the thread its hook ran on, and its running loop."""
    call: Any = channel.unary_unary(
        f"/{SERVICE_NAME}/ProcessInput",
        request_serializer=ppb.ProcessInputRequest.SerializeToString,
        response_deserializer=ppb.ProcessInputResponse.FromString,
    )
    ctx = tpb.RunContext(processor_id=processor_id, run_id="run-1", agent_id="agent-1")
    ctx.options.CopyFrom(convert.to_struct(options))
    resp = await call(ppb.ProcessInputRequest(context=ctx), timeout=30)
    thread, _, loop = resp.messages[0].id.partition("|")
    return thread, loop


async def until_on_server_thread(channel: grpc.aio.Channel, processor_id: str) -> list[tuple[str, str]]:
    """Calls one after another until one runs on the server's thread (at most 200): all seen."""
    seen = []
    for _ in range(200):
        seen.append(await where(channel, processor_id))
        if seen[-1][0] == SERVER_THREAD:
            break
    return seen


async def health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=0.5)
    return int(resp.status)


async def test_a_quick_hook_runs_on_the_servers_thread_when_its_loop_is_idle(
    channel: grpc.aio.Channel,
) -> None:
    seen = await until_on_server_thread(channel, "where")
    # first on its loop's thread (not yet shown quick), then taken by the server's thread
    assert seen[0][0] == "procmesh-hooks:where"
    assert seen[-1][0] == SERVER_THREAD
    # always on its own loop, whichever thread ran it: loop-bound clients keep working
    assert len({loop for _, loop in seen}) == 1


async def test_a_slow_turn_sends_the_processors_calls_back_to_its_thread(channel: grpc.aio.Channel) -> None:
    seen = await until_on_server_thread(channel, "where")
    assert seen[-1][0] == SERVER_THREAD
    # a turn that holds the CPU past its budget (taken by the server's thread when its loop is idle:
    # it cannot know in advance) ...
    assert (await where(channel, "where", burn=True))[1] == seen[0][1]
    # ... and then the processor's calls go through its thread again, until it shows quick turns
    assert await where(channel, "where") == ("procmesh-hooks:where", seen[0][1])


async def test_a_processor_may_declare_where_its_calls_run(channel: grpc.aio.Channel) -> None:
    # trusted to be quick: taken by the server's thread from the first call, even after a slow turn
    assert (await where(channel, "trusted"))[0] == SERVER_THREAD
    await where(channel, "trusted", burn=True)
    assert (await where(channel, "trusted"))[0] == SERVER_THREAD
    # strict: never, however quick its turns (an undeclared processor is taken after a few)
    strict = [(await where(channel, "strict"))[0] for _ in range(40)]
    assert set(strict) == {"procmesh-hooks:strict"}
    assert (await until_on_server_thread(channel, "where"))[-1][0] == SERVER_THREAD


async def test_a_cpu_bound_hook_stalls_neither_health_nor_quick_hooks(
    channel: grpc.aio.Channel, tmp_path: Path
) -> None:
    await until_on_server_thread(channel, "where")
    burning = asyncio.ensure_future(where(channel, "burner"))
    try:
        for _ in range(300):
            if (tmp_path / "burning").exists() or burning.done():
                break
            await asyncio.sleep(0.05)
        assert (tmp_path / "burning").exists()
        for _ in range(5):
            assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert (await until_on_server_thread(channel, "where"))[-1][0] == SERVER_THREAD
        assert not burning.done()
    finally:
        (tmp_path / "release").touch()
    assert (await burning)[0] == "procmesh-hooks:burner"


async def test_in_asyncios_debug_mode_every_call_goes_through_the_thread(tmp_path: Path) -> None:
    # debug mode refuses a loop's non-thread-safe calls from another thread: no turn is taken
    async with sidecar(tmp_path, PYTHONASYNCIODEBUG="1") as chan:
        seen = {(await where(chan, "trusted"))[0] for _ in range(20)}
    assert seen == {"procmesh-hooks:trusted"}


# -- turns taken in-process: what goes on on the thread, cancellation, a fused stream's relay ----


class Napper(Processor):
    """Trusted quick, but awaits a timer: its turn ends before it does."""

    id = "napper"
    quick_hooks = True
    seen: ClassVar[list[tuple[str, int]]] = []

    async def process_input(self) -> None:
        Napper.seen.append((threading.current_thread().name, id(asyncio.get_running_loop())))
        await asyncio.sleep(0.01)
        Napper.seen.append((threading.current_thread().name, id(asyncio.get_running_loop())))


class Waiter(Processor):
    """Trusted quick, but waits forever: the call's deadline cancels it on its own loop."""

    id = "waiter"
    quick_hooks = True
    cancelled = threading.Event()

    async def process_input(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            Waiter.cancelled.set()


def marker(pid: str) -> type[Processor]:
    class Marker(Processor):
        id = pid
        quick_hooks = True
        threads: ClassVar[list[str]] = []

        async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
            Marker.threads.append(threading.current_thread().name)
            return {**part, "payload": {**part["payload"], "text": part["payload"]["text"] + pid}}

    return Marker


def context(processor_id: str, *fused: str) -> tpb.RunContext:
    ctx = tpb.RunContext(processor_id=processor_id, run_id="run-1", agent_id="agent-1")
    for member in fused:
        ctx.fused.add(processor_id=member)
    return ctx


async def test_a_hook_that_awaits_in_a_taken_turn_goes_on_on_its_thread() -> None:
    Napper.seen = []
    async with serve_for_test([Napper()]) as client:
        await client.call("ProcessInput", ppb.ProcessInputRequest(context=context("napper")), 30)
    (before, loop), (after, same) = Napper.seen
    assert before == threading.current_thread().name  # the server's thread (this test's) took the turn
    assert after == "procmesh-hooks:napper"  # the timer fired on the processor's own thread
    assert loop == same


async def test_a_hook_still_running_after_a_taken_turn_is_cancelled_at_the_deadline() -> None:
    Waiter.cancelled.clear()
    async with serve_for_test([Waiter()]) as client:
        with pytest.raises(ProcmeshError) as failed:
            await client.call("ProcessInput", ppb.ProcessInputRequest(context=context("waiter")), 0.3)
        assert failed.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await asyncio.to_thread(Waiter.cancelled.wait, 10)


async def test_a_fused_streams_batch_runs_through_every_member_in_taken_turns() -> None:
    members = [marker(pid) for pid in ("x", "y", "z")]
    async with serve_for_test([m() for m in members]) as client:
        call = client.open_stream(30)
        part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "a"}})
        request = ppb.ProcessOutputStreamRequest(parts=[ppb.StreamPart(seq=1, part=part)])
        request.context.CopyFrom(context("x", "y", "z"))
        await call.write(request)
        answer = await call.read()
        call.cancel()
    assert convert.chunk_from_proto(answer.results[0].part)["payload"]["text"] == "axyz"
    assert [m.threads for m in members] == [[threading.current_thread().name]] * 3  # type: ignore[attr-defined]
