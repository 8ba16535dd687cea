"""What test_sdk_parity.py sends both SDKs and how it reads their answers: every message part and
chunk kind, run contexts, rich and bare requests per hook (`UNARY`), output-stream requests, and
the calls that send one request to both servers (`Pair`) and compare what came back (`Answer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.parity_twins import Message, text_message

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
