"""Hosted tools (`procmesh.Tool`) on a real ProcessorServer, called as the orchestrator calls them.

`ExecuteTool` with an empty `context.processor_id` runs the hosted tool `tool_name`; what a tool
raises comes back as `ExecuteToolResponse.error` (so does what a processor's `execute_tool`
raises), a `ProcmeshError` keeps its status. One server per module hosts the tools below.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

import procmesh
from procmesh import SERVICE_NAME, Processor, ProcessorClient, ProcessorServer, Tool, ToolContext, convert
from procmesh._check.checker import check
from procmesh.errors import NotReadyError
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT = 5.0
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class Weather(Tool):
    name = "weather"
    description = "Current weather for a city."
    input_schema = WEATHER_SCHEMA

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        return {
            "city": args["city"],
            "tempC": 21,
            "context": {
                "run_id": context.run_id,
                "agent_id": context.agent_id,
                "tool_call_id": context.tool_call_id,
                "thread_id": context.thread_id,
                "resource_id": context.resource_id,
                "request_context": context.request_context,
                "message_ids": [m["id"] for m in context.messages],
            },
            "thread": threading.current_thread().name,
        }


class Broken(Tool):
    name = "broken"

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        if args.get("long"):
            raise ValueError("x" * 10_000)
        if args.get("empty"):
            raise KeyError()
        raise RuntimeError(f"no weather for {args.get('city')}")


class Refusing(Tool):
    name = "refusing"

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        raise NotReadyError("the upstream API is down")


class NotJson(Tool):
    name = "not-json"

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        return {"when": object()}


class Slow(Tool):
    """Waits until cancelled; records the cancellation (it runs on another thread)."""

    name = "slow"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return "never"


class Busy(Tool):
    """Computes without awaiting until `release` is set (or `seconds` pass); records start and end."""

    name = "busy"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        self.started.set()
        end = time.monotonic() + float(args["seconds"])
        n = 0
        while not self.release.is_set() and time.monotonic() < end:
            n += 1
        self.finished.set()
        return n > 0


class Adder(Processor):
    """A processor's own tool (execute_tool), next to the hosted ones."""

    id = "adder"

    async def execute_tool(self, tool_name: str, args: Any, state: dict[str, Any]) -> Any:
        state["ran"] = tool_name
        if args.get("fail") == "plain":
            raise ZeroDivisionError("cannot add that")
        if args.get("fail") == "status":
            raise NotReadyError("adder is warming up")
        return args["a"] + args["b"]


SLOW = Slow()
BUSY = Busy()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[ProcessorServer]:
    tools = [Weather(), Broken(), Refusing(), NotJson(), SLOW, BUSY]
    async with ProcessorServer([Adder()], ["127.0.0.1:0"], tools=tools) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channel(server: ProcessorServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.addresses[0]) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pgrpc.ProcessorServiceStub:
    return pgrpc.ProcessorServiceStub(channel)


def tool_request(
    name: str, args: Any = None, *, processor_id: str = "", state: dict[str, Any] | None = None
) -> ppb.ExecuteToolRequest:
    req = ppb.ExecuteToolRequest(
        context=tpb.RunContext(
            processor_id=processor_id,
            run_id="run-7",
            agent_id="agent-7",
            thread_id="th-1",
            resource_id="rs-1",
            request_context=convert.to_struct({"tenant": "t1"}),
            state=convert.to_struct(state),
        ),
        tool_name=name,
        tool_call_id="call_9",
        messages=[
            convert.message_to_proto(
                {
                    "id": "u1",
                    "role": "user",
                    "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]},
                }
            )
        ],
    )
    if args is not None:
        req.args.CopyFrom(convert.to_value(args))
    return req


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- Describe ------------------------------------------------------------------------------------


async def test_describe_lists_the_hosted_tools(
    stub: pgrpc.ProcessorServiceStub, server: ProcessorServer
) -> None:
    resp = await stub.Describe(ppb.DescribeRequest(), timeout=TIMEOUT)
    assert [p.id for p in resp.processors] == ["adder"]
    assert [t.name for t in resp.tools] == ["weather", "broken", "refusing", "not-json", "slow", "busy"]
    weather = resp.tools[0]
    assert weather.description == "Current weather for a city."
    assert convert.from_struct(weather.input_schema) == WEATHER_SCHEMA
    assert convert.from_struct(resp.tools[1].input_schema) == {"type": "object"}  # the default
    assert server.tool_names == [t.name for t in resp.tools]


# -- calls -----------------------------------------------------------------------------------------


async def test_a_hosted_tool_runs_with_its_args_and_context(stub: pgrpc.ProcessorServiceStub) -> None:
    resp = await stub.ExecuteTool(tool_request("weather", {"city": "Paris"}), timeout=TIMEOUT)
    assert resp.error == ""
    result = convert.from_value(resp.result)
    assert result["city"] == "Paris"
    assert result["context"] == {
        "run_id": "run-7",
        "agent_id": "agent-7",
        "tool_call_id": "call_9",
        "thread_id": "th-1",
        "resource_id": "rs-1",
        "request_context": {"tenant": "t1"},
        "message_ids": ["u1"],
    }
    assert result["thread"] == "procmesh-tool:weather"  # its own hook loop, not the server's
    assert not resp.HasField("effects")


async def test_a_raising_tool_answers_its_error_not_a_status(stub: pgrpc.ProcessorServiceStub) -> None:
    resp = await stub.ExecuteTool(tool_request("broken", {"city": "Oslo"}), timeout=TIMEOUT)
    assert resp.error == "no weather for Oslo"
    assert not resp.HasField("result")


async def test_a_tool_error_is_clipped_and_never_empty(stub: pgrpc.ProcessorServiceStub) -> None:
    long = await stub.ExecuteTool(tool_request("broken", {"long": True}), timeout=TIMEOUT)
    assert len(long.error) <= 2048
    assert long.error.endswith("... (10000 characters)")
    empty = await stub.ExecuteTool(tool_request("broken", {"empty": True}), timeout=TIMEOUT)
    assert empty.error == "KeyError"


async def test_a_tool_raising_a_procmesh_error_keeps_its_status(stub: pgrpc.ProcessorServiceStub) -> None:
    err = await rpc_error(stub.ExecuteTool(tool_request("refusing"), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details() == "the upstream API is down"


async def test_a_non_json_result_is_internal(stub: pgrpc.ProcessorServiceStub) -> None:
    err = await rpc_error(stub.ExecuteTool(tool_request("not-json"), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "tool 'not-json' returned a non-JSON result" in (err.details() or "")


async def test_an_unknown_hosted_tool_is_not_found(stub: pgrpc.ProcessorServiceStub) -> None:
    err = await rpc_error(stub.ExecuteTool(tool_request("ghost"), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "tool 'ghost' is not hosted here" in (err.details() or "")
    assert "weather" in (err.details() or "")


async def test_a_processor_id_still_addresses_the_processors_execute_tool(
    stub: pgrpc.ProcessorServiceStub,
) -> None:
    resp = await stub.ExecuteTool(
        tool_request("add", {"a": 2, "b": 3}, processor_id="adder"), timeout=TIMEOUT
    )
    assert (convert.from_value(resp.result), resp.error) == (5, "")
    assert convert.from_struct(resp.effects.state) == {"ran": "add"}
    # a processor id wins over a hosted tool of the same name
    resp = await stub.ExecuteTool(
        tool_request("weather", {"a": 1, "b": 1}, processor_id="adder"), timeout=TIMEOUT
    )
    assert convert.from_value(resp.result) == 2


async def test_a_processors_raising_execute_tool_answers_its_error(stub: pgrpc.ProcessorServiceStub) -> None:
    req = tool_request("add", {"fail": "plain"}, processor_id="adder", state={"kept": True})
    resp = await stub.ExecuteTool(req, timeout=TIMEOUT)
    assert resp.error == "cannot add that"
    assert not resp.HasField("result")
    assert not resp.effects.HasField(
        "state"
    )  # a raising hook's state change is dropped: the stored one stays


async def test_a_processors_execute_tool_raising_a_procmesh_error_keeps_its_status(
    stub: pgrpc.ProcessorServiceStub,
) -> None:
    req = tool_request("add", {"fail": "status"}, processor_id="adder")
    err = await rpc_error(stub.ExecuteTool(req, timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


async def test_cancelling_the_call_cancels_the_tool(stub: pgrpc.ProcessorServiceStub) -> None:
    SLOW.started.clear()
    SLOW.cancelled.clear()
    call = stub.ExecuteTool(tool_request("slow"), timeout=TIMEOUT)
    assert await asyncio.to_thread(SLOW.started.wait, TIMEOUT)
    call.cancel()
    assert await asyncio.to_thread(SLOW.cancelled.wait, TIMEOUT)


async def test_a_passed_deadline_cancels_the_tool(stub: pgrpc.ProcessorServiceStub) -> None:
    SLOW.started.clear()
    SLOW.cancelled.clear()
    err = await rpc_error(stub.ExecuteTool(tool_request("slow"), timeout=0.3))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await asyncio.to_thread(SLOW.cancelled.wait, TIMEOUT)


async def test_a_computing_tool_does_not_hold_up_health_checks(
    stub: pgrpc.ProcessorServiceStub, channel: grpc.aio.Channel
) -> None:
    # The tool computes until released (at most TIMEOUT): a health check held up by it would only
    # be answered once the tool had finished, which `finished` shows (no clock is asserted).
    BUSY.started.clear()
    BUSY.release.clear()
    BUSY.finished.clear()
    request = tool_request("busy", {"seconds": TIMEOUT})
    busy = asyncio.ensure_future(stub.ExecuteTool(request, timeout=2 * TIMEOUT))
    try:
        assert await asyncio.to_thread(BUSY.started.wait, TIMEOUT)
        health = health_pb2_grpc.HealthStub(channel)
        resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2 * TIMEOUT)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert not BUSY.finished.is_set(), "the health check waited for the computing tool"
    finally:
        BUSY.release.set()
    assert convert.from_value((await busy).result) is True
    assert BUSY.finished.is_set()


async def test_tool_calls_are_counted_by_tool_and_outcome(
    stub: pgrpc.ProcessorServiceStub, server: ProcessorServer
) -> None:
    def count(tool: str, outcome: str) -> float:
        labels = {"tool": tool, "outcome": outcome}
        return server.registry.get_sample_value("procmesh_sidecar_tool_calls_total", labels) or 0.0

    before = (count("weather", "ok"), count("broken", "tool_error"))
    await stub.ExecuteTool(tool_request("weather", {"city": "Rome"}), timeout=TIMEOUT)
    await stub.ExecuteTool(tool_request("broken"), timeout=TIMEOUT)
    assert (count("weather", "ok") - before[0], count("broken", "tool_error") - before[1]) == (1, 1)


# -- hosting ---------------------------------------------------------------------------------------


class Nameless(Tool):
    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        return None


class ArraySchema(Weather):
    name = "array"
    input_schema: ClassVar[dict[str, Any]] = {"type": "array"}


class NoExecute(Tool):
    name = "lazy"


class BadName(Weather):
    name = "has space"


@pytest.mark.parametrize(
    ("tools", "error", "says"),
    [
        ([Weather(), Weather()], ValueError, "two tools share the name 'weather'"),
        ([Nameless()], ValueError, "tool Nameless has no name"),
        ([ArraySchema()], ValueError, "tool 'array': input_schema must be a JSON schema object"),
        ([NoExecute()], ValueError, "tool 'lazy' does not implement execute()"),
        ([BadName()], ValueError, "name 'has space' must be 1-64 letters"),
        ([Weather], TypeError, "a tool must be a procmesh.Tool instance, got type"),
    ],
    ids=["duplicate", "nameless", "array-schema", "no-execute", "bad-name", "a-class"],
)
async def test_bad_tools_fail_when_the_server_is_built(
    tools: list[Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as info:
        ProcessorServer([Adder()], tools=tools)
    assert says in str(info.value)


async def test_a_sidecar_may_host_tools_only_and_serve_for_test_takes_them() -> None:
    async with serve_for_test([], tools=[Weather()]) as client:
        assert isinstance(client, ProcessorClient)
        described = await client.describe(timeout=TIMEOUT)
        assert ([p.id for p in described.processors], [t.name for t in described.tools]) == ([], ["weather"])
        resp = await client.call("ExecuteTool", tool_request("weather", {"city": "Lima"}), TIMEOUT)
        assert convert.from_value(resp.result)["city"] == "Lima"
    with pytest.raises(ValueError, match="at least one processor or tool"):
        ProcessorServer([])


async def test_the_tool_api_is_public() -> None:
    assert {"Tool", "ToolContext"} <= set(procmesh.__all__)


# -- procmesh-check-sidecar ------------------------------------------------------------------------


async def test_the_checker_lists_the_hosted_tools(server: ProcessorServer) -> None:
    out = io.StringIO()
    report = await check(server.addresses[0], timeout=2.0, out=out)
    lines = out.getvalue().splitlines()
    assert "PASS  hosted tools: weather, broken, refusing, not-json, slow, busy" in lines
    assert any(
        line.startswith("PASS  malformed ExecuteTool: unknown hosted tool: NOT_FOUND") for line in lines
    )
    assert report.count("FAIL") == 0, out.getvalue()


async def test_the_checker_passes_a_tools_only_sidecar() -> None:
    async with ProcessorServer([], tools=[Weather()]) as srv:
        out = io.StringIO()
        report = await check(srv.addresses[0], timeout=2.0, out=out)
    assert "PASS  hosted tools: weather" in out.getvalue().splitlines()
    assert report.count("FAIL") == 0, out.getvalue()


async def test_the_checker_fails_duplicate_names_and_a_non_object_schema() -> None:
    described = ppb.DescribeResponse(sdk="bad/0")
    for name, schema in (("a", {"type": "object"}), ("a", {"type": "object"}), ("b", {"type": "array"})):
        described.tools.add(name=name, input_schema=convert.to_struct(schema))

    async def describe(raw: bytes, context: Any) -> ppb.DescribeResponse:
        return described

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE_NAME,
                {
                    "Describe": grpc.unary_unary_rpc_method_handler(
                        describe, response_serializer=ppb.DescribeResponse.SerializeToString
                    )
                },
            ),
        )
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        for service in ("", SERVICE_NAME):
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        out = io.StringIO()
        await check(f"127.0.0.1:{port}", timeout=2.0, wait=1.0, out=out)
    finally:
        await server.stop(0)
    (line,) = [x for x in out.getvalue().splitlines() if "hosted tools" in x]
    assert line.startswith("FAIL  hosted tools: ")
    assert "tool 'a' is listed twice" in line
    assert "tool 'b': input_schema is not an object schema" in line
