"""The Node SDK's channel conventions: reflection lists what the Python SDK's does, and a draining
sidecar answers UNAVAILABLE while the call in flight finishes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from procmesh import SERVICE_NAME, ProcessorServer
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from procmesh_sidecars.examples import PiiRedactor
from tests.e2e.node.conftest import HERE, Sidecars, node_sidecar

pytestmark = pytest.mark.e2e

TIMEOUT = 5.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


async def reflect(
    address: str, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(timeout=TIMEOUT)
        await call.write(request)
        await call.done_writing()
        response: reflection_pb2.ServerReflectionResponse = await call.read()
        return response


async def services(address: str) -> list[str]:
    resp = await reflect(address, reflection_pb2.ServerReflectionRequest(list_services=""))
    return sorted(s.name for s in resp.list_services_response.service)


async def test_node_reflection_lists_the_python_sdks_services(sidecars: Sidecars) -> None:
    async with ProcessorServer([PiiRedactor()]) as python:
        expected = await services(python.addresses[0])
    assert await services(sidecars.node) == expected
    assert SERVICE_NAME in expected
    resp = await reflect(
        sidecars.node, reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME)
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in resp.file_descriptor_response.file_descriptor_proto
    ]
    methods = {m.name for f in files for s in f.service if s.name == "ProcessorService" for m in s.method}
    assert methods == {m.name for m in ppb.DESCRIPTOR.services_by_name["ProcessorService"].methods}


async def health_or_code(health: health_pb2_grpc.HealthStub) -> Any:
    """The health status, or the status code of a Check that failed."""
    try:
        resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return resp.status


async def _wait_for(path: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not await asyncio.to_thread(path.exists):
        assert loop.time() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.01)


async def test_a_draining_node_sidecar_answers_unavailable(sidecars: Sidecars, tmp_path: Path) -> None:
    hold_dir = sidecars.dir / "hold"
    hold_dir.mkdir(exist_ok=True)
    os.environ["HOLD_DIR"] = str(hold_dir)
    try:
        proc = node_sidecar(
            HERE / "hold.mjs", f"unix://{sidecars.dir / 'hold.sock'}", sidecars.dir / "hold.log"
        )
    finally:
        del os.environ["HOLD_DIR"]
    try:
        await proc.wait_ready()
        request = ppb.ProcessInputRequest(context=tpb.RunContext(processor_id="hold", run_id="r1"))
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = pgrpc.ProcessorServiceStub(channel)
            in_flight = asyncio.ensure_future(stub.ProcessInput(request, timeout=TIMEOUT))
            await _wait_for(hold_dir / "entered")
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            health = health_pb2_grpc.HealthStub(channel)
            # until the drain has begun: NOT_SERVING, or the server already refusing
            while (seen := await health_or_code(health)) == SERVING:  # noqa: ASYNC110 - polling a server
                await asyncio.sleep(0.01)
            assert seen in (NOT_SERVING, grpc.StatusCode.UNAVAILABLE)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ProcessInput(request, timeout=TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            (hold_dir / "release").touch()
            answer = await in_flight
            assert answer.effects.state.fields["served"].bool_value is True
        assert proc.proc.wait(TIMEOUT) == 0
    finally:
        proc.stop(grace=1)
