"""The Node SDK behaves like the Python SDK: same requests, same answers.

The processors below are served by the Python SDK in this process; their twins in
tests/e2e/node/contract.mjs are served by the Node SDK in a real Node process. Each case sends
the identical request to both and compares the responses field by field (or the status codes).
The `echo` processor records everything its hooks are handed into its state and returns it
unchanged, so the comparison also covers how each SDK decodes requests (every message part and
chunk kind, the run context) and encodes results.
"""

from __future__ import annotations

import asyncio
import base64
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from procmesh import SERVICE_NAME, MessageList, Processor, ProcessorServer, TripWire, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.conftest import HERE, NODE_SDK, Sidecars, node_sidecar, wait_all
from tests.fixtures.censor import Censor, DataCensor

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

Message = dict[str, Any]
SETUP_DELAY = 5.0
"""How long contract.mjs's slow setup() takes: long enough that a Node process started on a busy
2-core machine (1-3 s to load its modules) still answers Describe before it ends."""

# -- the Python twins of contract.mjs -------------------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_SKIP = {"abort", "send_signal", "writer", "report_violation", "message_list", "state", "model"}


def _record(hook: str, kw: dict[str, Any]) -> None:
    seen: dict[str, Any] = {}
    for key, value in kw.items():
        if key in _SKIP:
            continue
        seen[_camel(key)] = len(value) if key == "stream_parts" else _plain(value)
    if "message_list" in kw:
        seen["messageList"] = [m["id"] for m in kw["message_list"].get_all()]
    hooks = kw["state"].setdefault("seen", {})
    if hook == "processOutputStream":
        hooks.setdefault(hook, []).append(seen)
    else:
        hooks[hook] = seen


class Echo(Processor):
    id = "echo"
    process_data_parts = True

    async def process_input(self, **kw: Any) -> Any:
        _record("processInput", kw)
        return kw["messages"]

    async def process_input_step(self, **kw: Any) -> Any:
        _record("processInputStep", kw)
        keys = ("messages", "system_messages", "model", "tools", "tool_choice", "active_tools")
        return {k: kw[k] for k in (*keys, "provider_options", "model_settings")}

    async def process_llm_request(self, **kw: Any) -> Any:
        _record("processLLMRequest", kw)
        return {"prompt": kw["prompt"]}

    async def process_llm_response(self, **kw: Any) -> None:
        _record("processLLMResponse", kw)

    async def process_output_stream(self, **kw: Any) -> Any:
        _record("processOutputStream", kw)
        return kw["part"]

    async def process_output_step(self, **kw: Any) -> Any:
        _record("processOutputStep", kw)
        return kw["messages"]

    async def process_tool_result(self, **kw: Any) -> Any:
        _record("processToolResult", kw)
        return kw["result"]

    async def process_output_result(self, **kw: Any) -> Any:
        _record("processOutputResult", kw)
        return kw["messages"]

    async def process_api_error(self, **kw: Any) -> Any:
        _record("processAPIError", kw)
        return {"retry": False}


def text_message(msg_id: str, role: str, text: str) -> Message:
    return {"id": msg_id, "role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


class Effects(Processor):
    id = "effects"

    async def process_input(self, message_list: MessageList, state: dict[str, Any]) -> None:
        message_list.add(text_message("added", "user", "from the message list"))
        state["calls"] = state.get("calls", 0) + 1

    async def process_input_step(self, message_list: MessageList, messages: list[Message]) -> None:
        message_list.remove_by_ids([messages[0]["id"]])
        message_list.add(text_message("n1", "user", "new"))

    async def process_llm_response(self, chunks: list[Any], send_signal: Any, writer: Any, **kw: Any) -> None:
        text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
        await send_signal(
            {
                "type": "reactive",
                "contents": f"You wrote {len(text)} characters.",
                "tagName": "length-note",
                "attributes": {"zeta": 1, "alpha": "a", "mid": [1, 2]},
            }
        )
        await send_signal(
            {"type": "state", "contents": "a state signal", "metadata": {"k": "v"}, "id": "sig-1"}
        )
        await writer.custom({"type": "data-length", "data": {"chars": len(text)}, "transient": True})
        kw["report_violation"]("long answer", {"chars": len(text)})
        kw["report_violation"]("no detail")
        kw["state"]["history"] = [*kw["state"].get("history", []), len(text)]

    async def process_output_step(self, text: str, abort: Any) -> list[Message]:
        if "forbidden" in text:
            abort("forbidden word in output", retry=True, metadata={"word": "forbidden", "score": 0.9})
        if "default" in text:
            abort()
        if "thrown" in text:
            raise TripWire("thrown tripwire", metadata=["a", 1])
        return []

    async def process_output_result(self, messages: list[Message], result: dict[str, Any]) -> list[Message]:
        meta = {
            "chars": len(result["text"]),
            "finishReason": result["finishReason"],
            "usage": result["usage"],
        }
        return [{**m, "content": {**m["content"], "metadata": meta}} for m in messages]

    async def process_api_error(
        self, error: dict[str, Any], message_list: MessageList, retry_count: int
    ) -> Any:
        if error["status"] == 400 and retry_count == 0:
            message_list.remove_by_ids([message_list.get_all()[0]["id"]])
            return {"retry": True}
        return None

    async def process_tool_result(self, tool_name: str, result: Any) -> Any:
        if tool_name == "secrets":
            return {"redacted": True, "keys": sorted(result)}
        return None

    async def process_llm_request(self, prompt: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "prompt": [{"role": "system", "content": "Be brief."}, *prompt],
            "response": [
                {"type": "text-delta", "payload": {"id": "t1", "text": "from cache"}},
                {
                    "type": "finish",
                    "payload": {
                        "finishReason": "stop",
                        "usage": {"inputTokens": 0, "outputTokens": 2, "totalTokens": 2},
                    },
                },
            ],
        }


class Faulty(Processor):
    id = "faulty"

    async def process_input(self) -> None:
        raise RuntimeError("boom")

    async def process_input_step(self) -> int:
        return 42

    async def process_output_step(self) -> str:
        return "not a list"

    async def process_output_result(self, state: dict[str, Any]) -> None:
        state["tags"] = {"a"}  # a set has no JSON form

    async def process_tool_result(self, send_signal: Any) -> None:
        await send_signal({"type": "bogus", "contents": "x"})

    async def process_llm_request(self, writer: Any) -> None:
        await writer.custom({"type": "oops", "data": 1})

    async def process_llm_response(self) -> dict[str, bool]:
        return {"ignored": True}

    async def process_api_error(self) -> str:
        return "yes"


class StrictOptions(BaseModel):
    mode: Literal["a", "b"] = "a"
    limit: int = 3


class Strict(Processor):
    id = "strict"
    Options = StrictOptions

    async def process_input(self, options: StrictOptions, state: dict[str, Any]) -> None:
        state["options"] = options.model_dump()


# -- requests ------------------------------------------------------------------------------------

RICH: list[Message] = [
    {
        "id": "u1",
        "role": "user",
        "content": {
            "format": 2,
            "parts": [
                {"type": "text", "text": "hello"},
                {"type": "file", "mediaType": "image/png", "data": b"\x89PNG\x00\xff", "filename": "a.png"},
                {"type": "file", "mediaType": "text/plain", "data": "https://example.com/a.txt"},
                {"type": "data-note", "data": {"n": 1, "list": [1, 2.5, None, True, "s", {}, []]}},
            ],
            "metadata": {"source": "test", "nested": {"depth": 2, "empty": {}}},
        },
        "createdAt": "2025-01-01T00:00:00Z",
        "threadId": "thread-1",
        "resourceId": "res-1",
    },
    {
        "id": "a1",
        "role": "assistant",
        "content": {
            "format": 2,
            "parts": [
                {"type": "step-start"},
                {"type": "reasoning", "text": "thinking"},
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "result",
                        "toolCallId": "call_1",
                        "toolName": "weather",
                        "args": {"city": "Paris"},
                        "result": {"tempC": 21, "sky": ["clear"]},
                    },
                },
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "output-error",
                        "toolCallId": "call_2",
                        "toolName": "broken",
                        "args": None,
                        "errorText": "it failed",
                    },
                },
                {"type": "text", "text": "It is sunny."},
            ],
        },
    },
    {
        "id": "sig1",
        "role": "signal",
        "type": "system-reminder",
        "content": {
            "format": 2,
            "parts": [{"type": "text", "text": "be brief"}],
            "metadata": {"signal": {"type": "reactive", "attributes": {"k": "v"}}},
        },
    },
]
SYSTEM = [text_message("s1", "system", "You are helpful.")]
CHUNKS: list[dict[str, Any]] = [
    {"type": "text-delta", "payload": {"id": "t1", "text": "Hi"}},
    {"type": "text-delta", "payload": {"text": "no id"}},
    {
        "type": "tool-call",
        "payload": {"toolCallId": "call_1", "toolName": "weather", "args": {"city": "Paris"}},
    },
    {
        "type": "tool-result",
        "payload": {
            "toolCallId": "call_1",
            "toolName": "weather",
            "args": {"city": "Paris"},
            "result": {"t": 21},
            "providerExecuted": True,
        },
    },
    {"type": "tool-error", "payload": {"toolCallId": "call_3", "toolName": "x", "args": {}, "error": "nope"}},
    {"type": "data-progress", "data": {"pct": 50}, "transient": True},
    {"type": "data-empty", "data": None},
    {"type": "start", "payload": {"runId": "r1", "from": "AGENT"}},
    {
        "type": "finish",
        "payload": {
            "finishReason": "stop",
            "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7},
            "metadata": {"wordCount": 2},
        },
    },
    {"type": "error", "payload": {"message": "bad"}},
    {"type": "tripwire", "payload": {"processorId": "p", "reason": "r", "retry": True, "metadata": {"m": 1}}},
]
PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "hello"},
            {"type": "file", "mediaType": "image/png", "data": b"\x01\x02"},
            {"type": "file", "mediaType": "text/plain", "data": "https://example.com/x"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "reasoning", "text": "hm"},
            {"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "tool",
        "content": [{"type": "tool-result", "toolCallId": "c1", "toolName": "weather", "output": [1, 2]}],
    },
]
STEPS: list[dict[str, Any]] = [
    {
        "stepNumber": 0,
        "text": "first",
        "toolCalls": [{"toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris"}}],
        "toolResults": [
            {"toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris"}, "result": "sunny"}
        ],
        "finishReason": "tool-calls",
        "usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
    },
    {
        "stepNumber": 1,
        "text": "",
        "finishReason": "other",
        "tripwire": {"processorId": "g", "reason": "no", "retry": True, "metadata": None},
    },
]


def messages(*items: Message) -> list[tpb.Message]:
    return [convert.message_to_proto(m) for m in items]


def steps() -> list[tpb.StepResult]:
    out = []
    for step in STEPS:
        s = tpb.StepResult()
        convert.step_to_proto(step, s)
        out.append(s)
    return out


def context(
    pid: str, *, full: bool = True, options: dict[str, Any] | None = None, **kw: Any
) -> tpb.RunContext:
    if not full:
        return tpb.RunContext(processor_id=pid, options=convert.to_struct(options))
    return tpb.RunContext(
        processor_id=pid,
        run_id="run-1",
        agent_id="agent-1",
        step_number=2,
        retry_count=1,
        options=convert.to_struct(options),
        state=convert.to_struct(kw.pop("state", {"prev": {"x": [1, "y"]}})),
        request_context=convert.to_struct({"tenant": "t1", "n": 3, "flags": [True]}),
        thread_id="th-1",
        resource_id="rs-1",
        on_failure="fail-open",
        **kw,
    )


def usage() -> tpb.Usage:
    return tpb.Usage(input_tokens=5, output_tokens=7, total_tokens=12)


def rich_request(hook: str, ctx: tpb.RunContext) -> Any:
    """A request for `hook` using every field of its message."""
    if hook == "ProcessInput":
        return ppb.ProcessInputRequest(
            context=ctx,
            messages=messages(RICH[0]),
            all_messages=messages(*RICH),
            system_messages=messages(*SYSTEM),
        )
    if hook == "ProcessInputStep":
        req = ppb.ProcessInputStepRequest(
            context=ctx,
            messages=messages(*RICH),
            system_messages=messages(*SYSTEM),
            model="openai/gpt-4o",
            active_tools=["weather", "search"],
            steps=steps(),
        )
        tool = req.tools.add(name="weather", description="Weather.")
        tool.input_schema.CopyFrom(convert.to_struct({"type": "object", "required": ["city"]}))
        req.tools.add(name="search")
        req.tool_choice.mode = "tool"
        req.tool_choice.tool_name = "weather"
        req.provider_options.CopyFrom(convert.to_struct({"openai": {"reasoningEffort": "low"}}))
        req.model_settings.CopyFrom(convert.to_struct({"temperature": 0.5, "maxTokens": 100}))
        return req
    if hook == "ProcessLLMRequest":
        llm = ppb.ProcessLLMRequestRequest(context=ctx, model="demo", steps=steps())
        convert.prompt_to_proto(PROMPT, llm.prompt)
        return llm
    if hook == "ProcessLLMResponse":
        return ppb.ProcessLLMResponseRequest(
            context=ctx,
            chunks=[convert.chunk_to_proto(c) for c in CHUNKS],
            model="demo",
            steps=steps(),
            from_cache=True,
        )
    if hook == "ProcessOutputStep":
        req_os = ppb.ProcessOutputStepRequest(
            context=ctx,
            messages=messages(*RICH),
            system_messages=messages(*SYSTEM),
            text="the text",
            finish_reason="tool-calls",
            usage=usage(),
            steps=steps(),
        )
        call = req_os.tool_calls.add(tool_call_id="c9", tool_name="weather")
        call.args.CopyFrom(convert.to_value({"city": "Oslo"}))
        return req_os
    if hook == "ProcessToolResult":
        tr = ppb.ProcessToolResultRequest(
            context=ctx,
            messages=messages(*RICH),
            tool_name="weather",
            tool_call_id="call_1",
            provider_executed=True,
            steps=steps(),
        )
        tr.args.CopyFrom(convert.to_value({"city": "Paris"}))
        tr.result.CopyFrom(convert.to_value({"tempC": 21.5, "list": [1, None], "ok": False}))
        return tr
    if hook == "ProcessOutputResult":
        result = tpb.OutputResult(text="final", usage=usage(), finish_reason="stop", steps=steps())
        return ppb.ProcessOutputResultRequest(context=ctx, messages=messages(RICH[1]), result=result)
    if hook == "ProcessAPIError":
        error = tpb.APIError(status=400, message="rejected", body='{"e": 1}', retryable=True, id="ERR_X")
        error.details.CopyFrom(convert.to_struct({"why": ["a", "b"]}))
        return ppb.ProcessAPIErrorRequest(context=ctx, error=error, messages=messages(*RICH), steps=steps())
    raise ValueError(hook)


def bare_request(hook: str, ctx: tpb.RunContext) -> Any:
    """A request for `hook` with nothing but the context (every other field at its default)."""
    return getattr(ppb, f"{hook}Request")(context=ctx)


UNARY = [
    "ProcessInput",
    "ProcessInputStep",
    "ProcessLLMRequest",
    "ProcessLLMResponse",
    "ProcessOutputStep",
    "ProcessToolResult",
    "ProcessOutputResult",
    "ProcessAPIError",
]


# -- servers and calls --------------------------------------------------------------------------------


@dataclass
class Answer:
    """A unary answer: the status code, and the response as a dict (OK) or the details (error)."""

    code: grpc.StatusCode
    body: Any


@dataclass
class Pair:
    """One channel to each SDK's server."""

    python: Any
    node: Any
    node_proc: Any
    node_address: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node_contract(sidecars: Sidecars) -> AsyncIterator[tuple[Any, str, float]]:
    """contract.mjs in a Node process with a slow setup(); not waited for (the first test watches it)."""
    address = f"unix://{sidecars.dir / 'contract.sock'}"
    os.environ["SETUP_DELAY_MS"] = str(int(SETUP_DELAY * 1000))
    try:
        proc = node_sidecar(HERE / "contract.mjs", address, sidecars.dir / "contract.log")
    finally:
        del os.environ["SETUP_DELAY_MS"]
    started = time.monotonic()
    yield proc, address, started
    proc.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(node_contract: tuple[Any, str, float]) -> AsyncIterator[Pair]:
    proc, address, _ = node_contract
    await proc.wait_ready()
    server = ProcessorServer([Echo(), Effects(), Censor(), DataCensor(), Faulty(), Strict()], ["127.0.0.1:0"])
    await server.start()
    py_channel = grpc.aio.insecure_channel(server.addresses[0])
    node_channel = grpc.aio.insecure_channel(address)
    yield Pair(
        pgrpc.ProcessorServiceStub(py_channel), pgrpc.ProcessorServiceStub(node_channel), proc, address
    )
    await py_channel.close()
    await node_channel.close()
    await server.stop(grace=0.5)


def as_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


async def answer(stub: Any, hook: str, request: Any) -> Answer:
    try:
        resp = await getattr(stub, hook)(request, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return Answer(exc.code(), exc.details())
    return Answer(grpc.StatusCode.OK, as_dict(resp))


async def both(servers: Pair, hook: str, request: Any) -> tuple[Answer, Answer]:
    return await answer(servers.python, hook, request), await answer(servers.node, hook, request)


async def assert_same(servers: Pair, hook: str, request: Any) -> Answer:
    py, node = await both(servers, hook, request)
    assert node.code == py.code, (py, node)
    if py.code == grpc.StatusCode.OK:
        assert node.body == py.body
    return node


async def stream_answers(
    stub: Any, requests: list[ppb.ProcessOutputStreamRequest]
) -> tuple[Any, list[dict[str, Any]]]:
    call = stub.ProcessOutputStream(timeout=5)
    try:
        for req in requests:
            await call.write(req)
        await call.done_writing()
    except (grpc.aio.AioRpcError, grpc.aio.UsageError):
        # A server that ends the stream early (an abort) may close it before our
        # later writes land; the orchestrator drops such writes too
        # (processors/stream.py), and the reads below report the stream's status.
        pass
    out = []
    try:
        async for resp in call:
            out.append(as_dict(resp))
    except grpc.aio.AioRpcError as exc:
        return exc.code(), out
    return await call.code(), out


def stream_request(pid: str | None, *texts_or_chunks: Any, start: int = 1) -> ppb.ProcessOutputStreamRequest:
    req = ppb.ProcessOutputStreamRequest()
    if pid is not None:
        req.context.CopyFrom(context(pid, state={"seed": 1}))
    for i, item in enumerate(texts_or_chunks):
        chunk = (
            item if isinstance(item, dict) else {"type": "text-delta", "payload": {"id": "t", "text": item}}
        )
        req.parts.add(seq=start + i, part=convert.chunk_to_proto(chunk))
    return req


# -- lifecycle --------------------------------------------------------------------------------------


async def test_describe_answers_at_once_but_hooks_and_health_wait_for_setup(
    node_contract: tuple[Any, str, float],
) -> None:
    proc, address, started = node_contract
    fast_reconnect = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50)]
    async with grpc.aio.insecure_channel(address, options=fast_reconnect) as channel:
        stub = pgrpc.ProcessorServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                described = await stub.Describe(ppb.DescribeRequest(), timeout=0.5)
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() - started < 10, "the Node sidecar never answered Describe"
                await asyncio.sleep(0.02)
        # Health still NOT_SERVING (below) is what shows that Describe answered before setup()
        # finished; the clock is not asserted (it depends on the machine's load).
        assert described.sdk.startswith("procmesh-node/")
        for service in ("", SERVICE_NAME):
            status = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ProcessInput(ppb.ProcessInputRequest(context=context("slow")), timeout=1)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        await proc.wait_ready()
        assert time.monotonic() - started >= SETUP_DELAY
        await stub.ProcessInput(ppb.ProcessInputRequest(context=context("slow")), timeout=1)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=1)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_describe_lists_what_the_python_sdk_lists(servers: Pair) -> None:
    py = as_dict(await servers.python.Describe(ppb.DescribeRequest(), timeout=5))
    node = as_dict(await servers.node.Describe(ppb.DescribeRequest(), timeout=5))
    assert node["sdk"].startswith("procmesh-node/")
    py_infos = {p["id"]: p for p in py["processors"]}
    node_infos = {p["id"]: p for p in node["processors"] if p["id"] != "slow"}
    assert set(node_infos) == set(py_infos)
    for pid, info in py_infos.items():
        other = node_infos[pid]
        assert other["hooks"] == info["hooks"], pid
        assert other.get("process_data_parts", False) == info.get("process_data_parts", False), pid
        assert other["name"] == info["name"]
    assert "options_schema_json" in node_infos["strict"]


async def test_the_unix_socket_is_group_accessible_only(servers: Pair) -> None:
    path = servers.node_address[len("unix://") :]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


# -- decoding and encoding: the echo processor -------------------------------------------------------


@pytest.mark.parametrize("hook", UNARY)
async def test_every_request_field_reaches_the_hook_and_comes_back_alike(servers: Pair, hook: str) -> None:
    node = await assert_same(servers, hook, rich_request(hook, context("echo")))
    assert node.code == grpc.StatusCode.OK
    seen = convert.from_struct(json_format.ParseDict(node.body["effects"]["state"], tpb.RunContext().state))
    assert seen["prev"] == {"x": [1, "y"]}  # the state sent, kept
    assert seen["seen"]  # the hook recorded what it was handed


@pytest.mark.parametrize("hook", UNARY)
async def test_a_bare_request_gives_the_same_defaults(servers: Pair, hook: str) -> None:
    await assert_same(servers, hook, bare_request(hook, context("echo", full=False)))


async def test_the_echoed_messages_round_trip_unchanged(servers: Pair) -> None:
    node = await assert_same(servers, "ProcessOutputStep", rich_request("ProcessOutputStep", context("echo")))
    back = [
        convert.message_from_proto(json_format.ParseDict(m, tpb.Message())) for m in node.body["messages"]
    ]
    assert back == [convert.message_from_proto(m) for m in messages(*RICH)]
    assert node.body["replace_messages"] is True


async def test_stream_parts_of_every_kind_reach_the_hook_alike(servers: Pair) -> None:
    requests = [stream_request("echo", *CHUNKS[:4]), stream_request(None, *CHUNKS[4:], start=5)]
    py_code, py = await stream_answers(servers.python, requests)
    node_code, node = await stream_answers(servers.node, requests)
    assert (py_code, node_code) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
    assert node == py
    assert [int(r["seq"]) for resp in node for r in resp.get("results", [])] == list(
        range(1, len(CHUNKS) + 1)
    )
    assert "end" in node[-1]


# -- results and effects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "text"),
    [
        ("ProcessInput", ""),
        ("ProcessInputStep", ""),
        ("ProcessLLMRequest", ""),
        ("ProcessLLMResponse", ""),
        ("ProcessOutputStep", "forbidden"),
        ("ProcessOutputStep", "default"),
        ("ProcessOutputStep", "thrown"),
        ("ProcessOutputStep", "fine"),
        ("ProcessOutputResult", ""),
        ("ProcessAPIError", ""),
        ("ProcessToolResult", "secrets"),
        ("ProcessToolResult", "weather"),
    ],
)
async def test_results_signals_chunks_violations_and_aborts_are_encoded_alike(
    servers: Pair, hook: str, text: str
) -> None:
    req = rich_request(hook, context("effects", state={"history": [1]}))
    if hook == "ProcessOutputStep":
        req.text = text
    if hook == "ProcessToolResult":
        req.tool_name = text
    node = await assert_same(servers, hook, req)
    assert node.code == grpc.StatusCode.OK
    if text == "default":
        assert node.body["effects"]["abort"] == {"reason": "Tripwire triggered by effects"}
    if text == "forbidden":
        abort = node.body["effects"]["abort"]
        assert abort["retry"] is True
        assert abort["metadata"] == {"word": "forbidden", "score": 0.9}


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({}, grpc.StatusCode.OK),
        ({"mode": "b", "limit": 7}, grpc.StatusCode.OK),
        ({"mode": "c"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"limit": [1]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"typo": 1}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_options_are_validated_alike(
    servers: Pair, options: dict[str, Any], code: grpc.StatusCode
) -> None:
    req = ppb.ProcessInputRequest(context=context("strict", options=options))
    node = await assert_same(servers, "ProcessInput", req)
    assert node.code == code, node.body
    if code != grpc.StatusCode.OK:
        assert "invalid options for processor 'strict'" in node.body


# -- errors ------------------------------------------------------------------------------------------

ERRORS: list[tuple[str, str, Callable[[str], tpb.RunContext], grpc.StatusCode, str]] = [
    (
        "ProcessInput",
        "missing id",
        lambda h: context(""),
        grpc.StatusCode.INVALID_ARGUMENT,
        "processor_id is required",
    ),
    (
        "ProcessInput",
        "unknown",
        lambda h: context("ghost"),
        grpc.StatusCode.NOT_FOUND,
        "'ghost' is not hosted here",
    ),
    (
        "ProcessInputStep",
        "unimplemented",
        lambda h: context("strict"),
        grpc.StatusCode.UNIMPLEMENTED,
        "'strict'",
    ),
    (
        "ProcessInput",
        "raises",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processor 'faulty' hook processInput raised Error: boom",
    ),
    (
        "ProcessInputStep",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processInputStep returned",
    ),
    (
        "ProcessOutputStep",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processOutputStep returned",
    ),
    (
        "ProcessOutputResult",
        "non-JSON state",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "cannot be sent",
    ),
    (
        "ProcessToolResult",
        "bad signal",
        lambda h: context("faulty"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown signal type",
    ),
    (
        "ProcessLLMRequest",
        "bad custom chunk",
        lambda h: context("faulty"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "must start with 'data-'",
    ),
    ("ProcessLLMResponse", "return ignored", lambda h: context("faulty"), grpc.StatusCode.OK, ""),
    (
        "ProcessAPIError",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processAPIError returned",
    ),
]


@pytest.mark.parametrize(
    ("hook", "what", "ctx", "code", "says"), ERRORS, ids=[f"{e[0]}-{e[1]}" for e in ERRORS]
)
async def test_errors_get_the_same_status_codes(
    servers: Pair,
    hook: str,
    what: str,
    ctx: Callable[[str], tpb.RunContext],
    code: grpc.StatusCode,
    says: str,
) -> None:
    node = await assert_same(servers, hook, rich_request(hook, ctx(hook)))
    assert node.code == code, node.body
    if code != grpc.StatusCode.OK:
        assert says in node.body


@pytest.mark.parametrize("hook", [h for h in UNARY if h not in ("ProcessLLMRequest", "ProcessLLMResponse")])
async def test_a_message_part_of_an_unknown_kind_passes_through_untouched(servers: Pair, hook: str) -> None:
    # A newer orchestrator's part kind (field 15 of Part's oneof, unknown to this release) and a
    # part with nothing set: both SDKs answer OK, show them to the hook, and echo returns them
    # byte for byte (proto/README.md, forward compatibility).
    req = rich_request(hook, context("echo"))
    req.messages[0].content.parts.add().MergeFromString(b"\x7a\x06\x0a\x04soon")
    req.messages[0].content.parts.add()
    sent = [p.SerializeToString() for p in req.messages[0].content.parts]
    await assert_same(servers, hook, req)
    for stub in (servers.python, servers.node):
        resp = await getattr(stub, hook)(req, timeout=5)
        returned = [m for name in ("messages", "all_messages") for m in getattr(resp, name, ())]
        echoed = [m for m in returned if m.id == req.messages[0].id]
        if hook in ("ProcessInput", "ProcessOutputStep", "ProcessOutputResult"):
            assert echoed, resp  # echo returns its messages: the parts must be there as sent
        for msg in echoed:
            # the two new parts byte for byte; the known ones as messages (a Struct's map may be
            # serialized in another key order by another runtime, and is the same message)
            assert [p.SerializeToString() for p in msg.content.parts[-2:]] == sent[-2:]
            assert list(msg.content.parts[:-2]) == list(req.messages[0].content.parts[:-2])


# -- the output stream --------------------------------------------------------------------------------

STREAMS = {
    "keep-replace-drop-emit": ("censor", [["a", "up:loud"], ["drop", "emit"], ["z"]]),
    "abort-midway": ("censor", [["a", "stop", "never"], ["after"]]),
    "data-parts-pass-by": ("censor", [["a", {"type": "data-x", "data": {"k": 1}}, "b"]]),
    "data-parts-handed-over": ("data-censor", [[{"type": "data-x", "data": {"k": 1}}, "b"]]),
    "no-parts": ("censor", [[]]),
}


@pytest.mark.parametrize("case", list(STREAMS))
async def test_streams_are_answered_alike(servers: Pair, case: str) -> None:
    pid, batches = STREAMS[case]
    requests, seq = [], 1
    for i, batch in enumerate(batches):
        requests.append(stream_request(pid if i == 0 else None, *batch, start=seq))
        seq += len(batch)
    py_code, py = await stream_answers(servers.python, requests)
    node_code, node = await stream_answers(servers.node, requests)
    assert node_code == py_code == grpc.StatusCode.OK
    assert node == py
    assert "end" in node[-1]
    if case == "abort-midway":
        results = [r for resp in node for r in resp.get("results", [])]
        assert [int(r["seq"]) for r in results] == [1, 2]
        assert results[-1]["effects"]["abort"]["reason"] == "stop word"


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (stream_request("", "a"), grpc.StatusCode.INVALID_ARGUMENT),
        (stream_request("ghost", "a"), grpc.StatusCode.NOT_FOUND),
        (stream_request("strict", "a"), grpc.StatusCode.UNIMPLEMENTED),
        (stream_request("censor", "boom"), grpc.StatusCode.INTERNAL),
        (stream_request("censor", "bad"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_stream_failures_get_the_same_status_codes(
    servers: Pair, first: ppb.ProcessOutputStreamRequest, code: grpc.StatusCode
) -> None:
    py_code, _ = await stream_answers(servers.python, [first])
    node_code, _ = await stream_answers(servers.node, [first])
    assert node_code == py_code == code


async def test_the_stream_hook_is_handed_the_documented_arguments(servers: Pair) -> None:
    _, node = await stream_answers(servers.node, [stream_request("echo", "x")])
    _, py = await stream_answers(servers.python, [stream_request("echo", "x")])
    state = node[-1]["end"]["state"]
    (seen,) = state["seen"]["processOutputStream"]
    (py_seen,) = py[-1]["end"]["state"]["seen"]["processOutputStream"]
    assert seen["onFailure"] == py_seen["onFailure"] == "fail-open"  # RunContext.on_failure
    assert sorted(seen) == sorted(
        [
            "agentId",
            "onFailure",
            "options",
            "part",
            "requestContext",
            "resourceId",
            "retryCount",
            "runId",
            "stepNumber",
            "streamParts",
            "threadId",
        ]
    )


# -- stopping ---------------------------------------------------------------------------------------


def socket_exists(path: str) -> bool:
    return os.path.exists(path)


@pytest.fixture
def examples_process(sidecars: Sidecars) -> Iterator[Any]:
    proc = node_sidecar(
        NODE_SDK / "examples" / "serve.mjs", f"unix://{sidecars.dir / 'stop.sock'}", sidecars.dir / "stop.log"
    )
    wait_all([proc])
    yield proc
    proc.stop(grace=1.0)


async def test_sigterm_drains_and_removes_the_socket(examples_process: Any) -> None:
    path = examples_process.address[len("unix://") :]
    assert socket_exists(path)
    assert examples_process.stop(grace=5.0) == 0
    assert not socket_exists(path)
