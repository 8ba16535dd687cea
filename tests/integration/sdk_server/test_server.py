"""ProcessorServer on real sockets (TCP and a unix socket), the server itself: the addresses it
resolves, health, reflection and Describe on one server per module; setup gating readiness and a
graceful stop on servers of their own (these tests stop them).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import procmesh
from procmesh import SERVICE_NAME, Processor, ProcessorClient, ProcessorServer
from procmesh._hosted import NO_OPTIONS_SCHEMA
from procmesh.v1 import processor_pb2 as ppb
from tests.integration.sdk_server.support import (
    HOSTED_IDS,
    NOT_SERVING,
    SERVING,
    TIMEOUT,
    TRANSPORTS,
    ShoutOptions,
    rpc_error,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


# -- server surface: addresses, health, reflection, describe ----------------------------------


async def test_addresses_resolve_the_port_and_keep_the_unix_path(
    server: ProcessorServer, sidecar_dir: Path
) -> None:
    tcp, unix = server.addresses
    host, port = tcp.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) > 0
    assert unix == f"unix://{sidecar_dir / 'sdk.sock'}"
    assert server.processor_ids == HOSTED_IDS


async def test_unix_socket_file_is_group_accessible_only(sidecar_dir: Path, server: ProcessorServer) -> None:
    mode = os.stat(sidecar_dir / "sdk.sock").st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


@TRANSPORTS
@pytest.mark.parametrize("service", ["", SERVICE_NAME])
async def test_health_is_serving(channels: dict[str, grpc.aio.Channel], transport: str, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(channels[transport])
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
    assert resp.status == SERVING


async def test_health_of_an_unknown_service_is_not_found(channels: dict[str, grpc.aio.Channel]) -> None:
    stub = health_pb2_grpc.HealthStub(channels["tcp"])
    err = await rpc_error(stub.Check(health_pb2.HealthCheckRequest(service="nope.v1.Nope"), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.NOT_FOUND


@TRANSPORTS
async def test_client_health_reports_serving(clients: dict[str, ProcessorClient], transport: str) -> None:
    assert await clients[transport].health(timeout=TIMEOUT) == "SERVING"


async def test_reflection_lists_the_services_and_serves_the_contract(
    channels: dict[str, grpc.aio.Channel],
) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channels["tcp"])
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    responses = [r async for r in stub.ServerReflectionInfo(iter(requests), timeout=TIMEOUT)]
    assert len(responses) == 2
    names = {s.name for s in responses[0].list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in responses[1].file_descriptor_response.file_descriptor_proto
    ]
    contract = next(f for f in files if f.name == "procmesh/v1/processor.proto")
    (service,) = contract.service
    assert service.name == "ProcessorService"
    assert {"Describe", "ProcessInput", "ProcessOutputStream", "ProcessAPIError"} <= {
        m.name for m in service.method
    }


@TRANSPORTS
async def test_describe_lists_processors_hooks_and_options(
    clients: dict[str, ProcessorClient], transport: str
) -> None:
    resp = await clients[transport].describe(timeout=TIMEOUT)
    assert resp.sdk == f"procmesh-python/{procmesh.__version__}"
    assert [p.id for p in resp.processors] == HOSTED_IDS
    info = {p.id: p for p in resp.processors}
    assert list(info["shouter"].hooks) == [ppb.HOOK_PROCESS_INPUT, ppb.HOOK_PROCESS_OUTPUT_RESULT]
    assert list(info["planner"].hooks) == [
        ppb.HOOK_PROCESS_INPUT_STEP,
        ppb.HOOK_PROCESS_LLM_REQUEST,
        ppb.HOOK_PROCESS_API_ERROR,
    ]
    assert list(info["guard"].hooks) == [
        ppb.HOOK_PROCESS_LLM_RESPONSE,
        ppb.HOOK_PROCESS_OUTPUT_STEP,
        ppb.HOOK_PROCESS_TOOL_RESULT,
    ]
    assert list(info["censor"].hooks) == [ppb.HOOK_PROCESS_OUTPUT_STREAM]
    assert (info["shouter"].name, info["shouter"].description) == ("Shouter", "Upper-cases the new input.")
    assert info["planner"].name == "planner"  # name defaults to the id
    assert [p.id for p in resp.processors if p.process_data_parts] == ["data-censor"]
    schema = json.loads(info["shouter"].options_schema_json)
    # closed to unknown keys, as the hook's own check is: the orchestrator refuses them at start-up
    assert schema == {**ShoutOptions.model_json_schema(), "additionalProperties": False}
    assert schema["properties"]["mode"]["enum"] == ["list", "dict", "none"]
    # no Options model: a processor none of whose hooks takes options publishes a schema taking
    # none (the orchestrator refuses a config's options for it at start-up); one whose hooks take
    # them (recorder's **kwargs) publishes none, as before
    schemas = {p.id: p.options_schema_json for p in resp.processors if p.id != "shouter"}
    assert schemas == {pid: NO_OPTIONS_SCHEMA for pid in schemas if pid != "recorder"} | {"recorder": ""}
    assert json.loads(NO_OPTIONS_SCHEMA) == {"type": "object", "additionalProperties": False}


# -- lifecycle (own servers: these stop them) ---------------------------------------------------


class Lifecycle(Processor):
    """Records setup/teardown; setup waits until the test releases it.

    Threading events, not asyncio ones: setup runs on the processor's hook loop, another thread.
    """

    id = "lifecycle"

    def __init__(self) -> None:
        self.in_setup = threading.Event()
        self.release = threading.Event()
        self.torn_down = False

    async def setup(self) -> None:
        self.in_setup.set()
        await asyncio.to_thread(self.release.wait, TIMEOUT)

    async def teardown(self) -> None:
        self.torn_down = True

    async def process_input(self) -> None:
        return None


async def _health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    req = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    resp = await stub.Check(req, timeout=TIMEOUT, wait_for_ready=True)
    return int(resp.status)


async def test_health_turns_serving_only_after_setup_returns() -> None:
    proc = Lifecycle()
    server = ProcessorServer([proc], ["127.0.0.1:0"])
    starting = asyncio.create_task(server.start())
    try:
        # setup() runs after the ports are bound and the server started.
        assert await asyncio.to_thread(proc.in_setup.wait, TIMEOUT)
        async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
            assert await _health(channel) == NOT_SERVING
            proc.release.set()
            await asyncio.wait_for(starting, TIMEOUT)
            assert await _health(channel) == SERVING
    finally:
        proc.release.set()
        await starting
        await server.stop(grace=0)


async def test_graceful_stop_reports_not_serving_then_removes_the_socket(sidecar_dir: Path) -> None:
    path = sidecar_dir / "stop.sock"
    proc = Lifecycle()
    proc.release.set()
    server = ProcessorServer([proc], [f"unix://{path}"])
    await server.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watches = [
                stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
                for service in ("", SERVICE_NAME)
            ]
            assert [(await w.read()).status for w in watches] == [SERVING, SERVING]
            stopping = asyncio.create_task(server.stop(grace=TIMEOUT))
            statuses = [(await asyncio.wait_for(w.read(), TIMEOUT)).status for w in watches]
            assert statuses == [NOT_SERVING, NOT_SERVING]
            for w in watches:
                w.cancel()
            await asyncio.wait_for(stopping, TIMEOUT)
    finally:
        await server.stop(grace=0)
    assert not path.exists()
    assert proc.torn_down
