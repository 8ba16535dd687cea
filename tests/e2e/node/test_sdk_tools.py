"""Hosted tools behave alike in both SDKs: same Describe entries, results, errors and status codes.

The tools below are served by the Python SDK in this process; their twins in
tests/e2e/node/tools.mjs by the Node SDK in a real Node process (started once for the module).
Each case sends the identical ExecuteTool request to both and compares the answers.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format

from procmesh import Processor, ProcessorServer, Tool, ToolContext, convert
from procmesh._check.checker import check
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.conftest import HERE, Sidecars, node_sidecar

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT = 5.0

# -- the Python twins of tools.mjs ---------------------------------------------------------------


class Weather(Tool):
    name = "weather"
    description = "Current weather for a city."
    input_schema = {  # noqa: RUF012 - the documented way to declare it
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        return {
            "city": args["city"],
            "tempC": 21,
            "runId": context.run_id,
            "agentId": context.agent_id,
            "toolCallId": context.tool_call_id,
            "threadId": context.thread_id,
            "resourceId": context.resource_id,
            "requestContext": context.request_context,
            "messageIds": [m["id"] for m in context.messages],
        }


class Broken(Tool):
    name = "broken"

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        if args.get("long"):
            raise ValueError("x" * 10_000)
        raise RuntimeError(f"no weather for {args.get('city')}")


SLOW = {"started": 0, "aborted": 0}  # only the tool's own loop touches it


class Slow(Tool):
    name = "slow"
    description = "Waits until the call is cancelled."

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        SLOW["started"] += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            SLOW["aborted"] += 1
            raise


class SlowStatus(Tool):
    name = "slow-status"

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        return dict(SLOW)


class Adder(Processor):
    id = "adder"

    async def execute_tool(self, tool_name: str, args: Any, state: dict[str, Any]) -> Any:
        state["ran"] = tool_name
        if args.get("fail") == "plain":
            raise ArithmeticError("cannot add that")
        return args["a"] + args["b"]


# -- servers -------------------------------------------------------------------------------------


@dataclass
class Pair:
    python: Any
    node: Any
    python_address: str
    node_address: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(sidecars: Sidecars) -> AsyncIterator[Pair]:
    address = f"unix://{sidecars.dir / 'tools.sock'}"
    proc = node_sidecar(HERE / "tools.mjs", address, sidecars.dir / "tools.log")
    tools = [Weather(), Broken(), Slow(), SlowStatus()]
    server = ProcessorServer([Adder()], ["127.0.0.1:0"], tools=tools)
    try:
        await server.start()
        await proc.wait_ready()
        async with (
            grpc.aio.insecure_channel(server.addresses[0]) as py_channel,
            grpc.aio.insecure_channel(address) as node_channel,
        ):
            yield Pair(
                pgrpc.ProcessorServiceStub(py_channel),
                pgrpc.ProcessorServiceStub(node_channel),
                server.addresses[0],
                address,
            )
    finally:
        await server.stop(grace=0.5)
        proc.stop(grace=2.0)


def as_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


async def answer(stub: Any, request: Any) -> tuple[grpc.StatusCode, Any]:
    try:
        resp = await stub.ExecuteTool(request, timeout=TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, as_dict(resp)


async def same(servers: Pair, request: Any) -> tuple[grpc.StatusCode, Any]:
    py = await answer(servers.python, request)
    node = await answer(servers.node, request)
    assert node[0] == py[0], (py, node)
    if py[0] == grpc.StatusCode.OK:
        assert node[1] == py[1]
    return node


def tool_request(name: str, args: Any = None, *, processor_id: str = "") -> ppb.ExecuteToolRequest:
    req = ppb.ExecuteToolRequest(
        context=tpb.RunContext(
            processor_id=processor_id,
            run_id="run-7",
            agent_id="agent-7",
            thread_id="th-1",
            request_context=convert.to_struct({"tenant": "t1", "n": 3}),
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


# -- cases ---------------------------------------------------------------------------------------


async def test_describe_lists_the_same_tools(servers: Pair) -> None:
    py = as_dict(await servers.python.Describe(ppb.DescribeRequest(), timeout=TIMEOUT))
    node = as_dict(await servers.node.Describe(ppb.DescribeRequest(), timeout=TIMEOUT))
    assert node["tools"] == py["tools"]
    assert [t["name"] for t in node["tools"]] == ["weather", "broken", "slow", "slow-status"]
    assert node["tools"][1]["input_schema"] == {"type": "object"}  # the default schema


async def test_a_hosted_tool_gets_the_same_args_and_context(servers: Pair) -> None:
    code, body = await same(servers, tool_request("weather", {"city": "Paris"}))
    assert code == grpc.StatusCode.OK
    assert body["result"]["requestContext"] == {"tenant": "t1", "n": 3}
    assert (body["result"]["threadId"], body["result"]["resourceId"]) == ("th-1", None)
    assert "error" not in body


@pytest.mark.parametrize(
    ("args", "error"),
    [({"city": "Oslo"}, "no weather for Oslo"), ({"long": True}, "... (10000 characters)")],
    ids=["message", "clipped"],
)
async def test_a_throwing_tool_gives_the_same_error(servers: Pair, args: dict[str, Any], error: str) -> None:
    code, body = await same(servers, tool_request("broken", args))
    assert code == grpc.StatusCode.OK
    assert body["error"].endswith(error)
    assert len(body["error"]) <= 2048
    assert "result" not in body


async def test_an_unknown_hosted_tool_is_not_found_in_both(servers: Pair) -> None:
    code, details = await same(servers, tool_request("ghost"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "tool 'ghost' is not hosted here" in details


async def test_a_processors_execute_tool_answers_alike(servers: Pair) -> None:
    code, body = await same(servers, tool_request("add", {"a": 2, "b": 3}, processor_id="adder"))
    assert (code, body["result"]) == (grpc.StatusCode.OK, 5)
    code, body = await same(servers, tool_request("add", {"fail": "plain"}, processor_id="adder"))
    assert (code, body) == (grpc.StatusCode.OK, {"error": "cannot add that"})


@pytest.mark.parametrize("language", ["python", "node"])
async def test_cancelling_the_call_cancels_the_tool(servers: Pair, language: str) -> None:
    stub = getattr(servers, language)

    async def status() -> dict[str, Any]:
        resp = await stub.ExecuteTool(tool_request("slow-status"), timeout=TIMEOUT)
        out: dict[str, Any] = convert.from_value(resp.result)
        return out

    before = await status()
    call = stub.ExecuteTool(tool_request("slow"), timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while (await status())["started"] == before["started"]:
        assert time.monotonic() < deadline, "the tool never started"
        await asyncio.sleep(0.02)
    call.cancel()
    while (await status())["aborted"] == before["aborted"]:
        assert time.monotonic() < deadline, "the tool was not cancelled"
        await asyncio.sleep(0.02)


async def test_the_checker_lists_the_node_sidecars_tools(servers: Pair) -> None:
    out = io.StringIO()
    report = await check(servers.node_address, timeout=2.0, out=out)
    assert "PASS  hosted tools: weather, broken, slow, slow-status" in out.getvalue().splitlines()
    assert report.count("FAIL") == 0, out.getvalue()
