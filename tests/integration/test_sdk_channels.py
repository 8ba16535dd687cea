"""Channel conventions on the wire: a starting or draining sidecar answers UNAVAILABLE, and the
client's retries carry a unary hook past a replica that is not ready to one that is."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh import SERVICE_NAME, Processor, ProcessorClient, ProcessorServer
from procmesh.errors import ProcmeshError, UnavailableError
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb

TIMEOUT = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_READY = "the sidecar is starting or draining; retry when health reports SERVING"


class Gate(Processor):
    """`setup()` and `process_input` each wait for their own release (threading events: hooks
    run on the processor's own loop thread)."""

    id = "gate"

    def __init__(self, *, hold_setup: bool = False, hold_calls: bool = False) -> None:
        self.setup_entered = threading.Event()
        self.setup_release = threading.Event()
        self.call_entered = threading.Event()
        self.call_release = threading.Event()
        if not hold_setup:
            self.setup_release.set()
        if not hold_calls:
            self.call_release.set()

    async def setup(self) -> None:
        self.setup_entered.set()
        await asyncio.to_thread(self.setup_release.wait, TIMEOUT)

    async def process_input(self, state: dict[str, Any]) -> None:
        self.call_entered.set()
        await asyncio.to_thread(self.call_release.wait, TIMEOUT)
        state["served"] = True


class Marker(Processor):
    """Only on the second replica, so Describe tells the replicas apart."""

    id = "marker"

    async def process_input(self) -> None:
        return None


def request(processor_id: str = "gate") -> ppb.ProcessInputRequest:
    return ppb.ProcessInputRequest(context=tpb.RunContext(processor_id=processor_id, run_id="r1"))


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def health_or_code(health: health_pb2_grpc.HealthStub) -> Any:
    """The health status, or the status code of a Check that failed."""
    try:
        resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return resp.status


def served(server: ProcessorServer) -> float:
    labels = {"processor": "gate", "hook": "process_input", "outcome": "ok"}
    return server.registry.get_sample_value("procmesh_sidecar_hook_calls_total", labels) or 0.0


async def test_a_starting_sidecar_answers_unavailable() -> None:
    gate = Gate(hold_setup=True)
    server = ProcessorServer([gate], ["127.0.0.1:0"])
    starting = asyncio.create_task(server.start())
    try:
        assert await asyncio.to_thread(gate.setup_entered.wait, TIMEOUT)
        async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
            err = await rpc_error(
                pgrpc.ProcessorServiceStub(channel).ProcessInput(request(), timeout=TIMEOUT)
            )
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, NOT_READY)
        async with ProcessorClient(server.addresses[0]) as client:
            # retried (3 attempts), then UnavailableError: the class UNAVAILABLE maps to
            with pytest.raises(UnavailableError, match="starting or draining"):
                await client.call("ProcessInput", request(), TIMEOUT)
            gate.setup_release.set()
            await asyncio.wait_for(starting, TIMEOUT)
            await client.call("ProcessInput", request(), TIMEOUT)
    finally:
        gate.setup_release.set()
        await starting
        await server.stop(grace=0)


async def test_a_draining_sidecar_answers_unavailable_and_finishes_calls_in_flight() -> None:
    gate = Gate(hold_calls=True)
    server = ProcessorServer([gate], ["127.0.0.1:0"])
    await server.start()
    address = server.addresses[0]
    async with ProcessorClient(address) as client, grpc.aio.insecure_channel(address) as watcher:
        in_flight = asyncio.create_task(client.call("ProcessInput", request(), TIMEOUT))
        assert await asyncio.to_thread(gate.call_entered.wait, TIMEOUT)
        stopping = asyncio.create_task(server.stop(grace=TIMEOUT))
        health = health_pb2_grpc.HealthStub(watcher)
        # until the drain has begun: health NOT_SERVING, or the port already refusing
        while (seen := await health_or_code(health)) == SERVING:  # noqa: ASYNC110 - polling a server
            await asyncio.sleep(0.01)
        assert seen in (health_pb2.HealthCheckResponse.NOT_SERVING, grpc.StatusCode.UNAVAILABLE)
        err = await rpc_error(pgrpc.ProcessorServiceStub(watcher).ProcessInput(request(), timeout=TIMEOUT))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(UnavailableError):
            await client.call("ProcessInput", request(), TIMEOUT)
        gate.call_release.set()
        answer = await in_flight  # the call in flight still finishes, within the grace period
        assert answer.effects.state.fields["served"].bool_value is True
        await stopping
    assert served(server) == 1


async def test_retries_carry_unary_hooks_past_a_replica_that_is_not_ready() -> None:
    ready = ProcessorServer([Gate()], ["127.0.0.1:0"])
    await ready.start()
    starting_gate = Gate(hold_setup=True)
    starting = ProcessorServer([starting_gate, Marker()], ["127.0.0.1:0"])
    start = asyncio.create_task(starting.start())
    try:
        assert await asyncio.to_thread(starting_gate.setup_entered.wait, TIMEOUT)
        target = f"ipv4:{ready.addresses[0]},{starting.addresses[0]}"
        async with ProcessorClient(target) as client:
            # Describe answers before setup: once both replicas have answered it, round_robin
            # holds a connected subchannel to each, so every other pick is the one in setup.
            seen: set[int] = set()
            while len(seen) < 2:
                seen.add(len((await client.describe(TIMEOUT)).processors))
            for _ in range(20):
                await client.call("ProcessInput", request(), TIMEOUT)
        assert served(ready) == 20
        assert served(starting) == 0
    finally:
        starting_gate.setup_release.set()
        await start
        await starting.stop(grace=0)
        await ready.stop(grace=0)


@pytest.mark.parametrize("method", ["ProcessInput", "ExecuteTool"])
async def test_a_hook_call_the_server_cancels_is_retried_a_tool_call_not(method: str) -> None:
    """A replica that cancels a call it took (gRPC does so to a call that races the server's
    shutdown, or whose grace ran out: the draining test above once saw CANCELLED, not
    UNAVAILABLE): a hook's call is tried again, as for UNAVAILABLE (hooks are safe to repeat);
    a tool's is not (it may have done part of its work). A raw gRPC server cancels the first
    call and answers the second."""
    attempts: list[str] = []

    async def answer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        attempts.append("cancelled" if not attempts else "answered")
        if len(attempts) == 1:
            await context.abort(grpc.StatusCode.CANCELLED, "the server is shutting down")
        return b""  # an empty response of either method

    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME, {method: grpc.unary_unary_rpc_method_handler(answer)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with ProcessorClient(f"127.0.0.1:{port}") as client:
            if method == "ExecuteTool":
                with pytest.raises(ProcmeshError, match="shutting down"):
                    await client.call(method, ppb.ExecuteToolRequest(), TIMEOUT)
                assert attempts == ["cancelled"]
            else:
                await client.call(method, request(), TIMEOUT)
                assert attempts == ["cancelled", "answered"]
    finally:
        await server.stop(0)
