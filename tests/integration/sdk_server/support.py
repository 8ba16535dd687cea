"""What the SDK server tests (tests/integration/sdk_server/) share: message and chunk builders, the
small processors one server per module hosts (`processors()`, `HOSTED_IDS`), the output stream's
request and reading helpers, and the call helpers (`rpc_error`, `TRANSPORTS`)."""

from __future__ import annotations

from typing import Any, Literal

import grpc
import pytest
from grpc_health.v1 import health_pb2
from pydantic import BaseModel

from procmesh import MessageList, Processor, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.fixtures.censor import Censor, DataCensor

Message = dict[str, Any]
Chunk = dict[str, Any]
TIMEOUT = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# -- message and chunk helpers -------------------------------------------------------


def text_message(msg_id: str, role: str, text: str, metadata: dict[str, Any] | None = None) -> Message:
    content: dict[str, Any] = {"format": 2, "parts": [{"type": "text", "text": text}]}
    if metadata:
        content["metadata"] = metadata
    return {"id": msg_id, "role": role, "content": content}


def text_of(msg: Message) -> str:
    return "".join(p.get("text", "") for p in msg["content"]["parts"] if p["type"] == "text")


def protos(*messages: Message) -> list[tpb.Message]:
    return [convert.message_to_proto(m) for m in messages]


def delta(text: str) -> Chunk:
    return {"type": "text-delta", "payload": {"id": "t1", "text": text}}


def run_context(
    processor_id: str,
    *,
    options: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    **kw: Any,
) -> tpb.RunContext:
    return tpb.RunContext(
        processor_id=processor_id,
        run_id="run-1",
        agent_id="agent-1",
        options=convert.to_struct(options),
        state=convert.to_struct(state),
        **kw,
    )


# -- processors under test -----------------------------------------------------------


class ShoutOptions(BaseModel):
    """Options of the shouter."""

    mode: Literal["list", "dict", "none"] = "list"
    suffix: str = "!"


class Shouter(Processor):
    """process_input in its three return shapes; process_output_result adds metadata."""

    id = "shouter"
    name = "Shouter"
    description = "Upper-cases the new input."
    Options = ShoutOptions

    async def process_input(
        self,
        messages: list[Message],
        system_messages: list[Message],
        message_list: MessageList,
        options: ShoutOptions,
        state: dict[str, Any],
    ) -> Any:
        state["calls"] = state.get("calls", 0) + 1
        state["seen"] = {
            "ids": [m["id"] for m in messages],
            "all_ids": [m["id"] for m in message_list.get_all()],
        }
        if options.mode == "none":
            return None
        if options.mode == "dict":
            return {"system_messages": [*system_messages, text_message("s2", "system", "Answer in English.")]}
        return [
            {
                **m,
                "content": {
                    **m["content"],
                    # Parts other than text are kept as they are (a newer kind's included).
                    "parts": [
                        {"type": "text", "text": text_of(m).upper() + options.suffix},
                        *(p for p in m["content"]["parts"] if p["type"] != "text"),
                    ],
                },
            }
            for m in messages
        ]

    async def process_output_result(self, messages: list[Message], result: dict[str, Any]) -> list[Message]:
        meta = {
            "chars": len(result["text"]),
            "finishReason": result["finishReason"],
            "usage": result["usage"],
        }
        return [{**m, "content": {**m["content"], "metadata": meta}} for m in messages]


class Planner(Processor):
    """Step overrides, prompt rewriting with a cached response, API error retries."""

    id = "planner"

    async def process_input_step(
        self,
        model: str,
        tools: list[dict[str, Any]],
        tool_choice: Any,
        active_tools: list[str],
        provider_options: dict[str, Any],
        step_number: int,
        retry_count: int,
        state: dict[str, Any],
    ) -> dict[str, Any]:
        state["seen"] = {
            "model": model,
            "tools": [t["name"] for t in tools],
            "tool_choice": tool_choice,
            "active_tools": active_tools,
            "provider_options": provider_options,
            "step": step_number,
            "retry": retry_count,
        }
        return {"tool_choice": "none", "model": "openai/gpt-4o-mini"}

    async def process_llm_request(self, prompt: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "prompt": [{"role": "system", "content": "Be brief."}, *prompt],
            "response": CACHED_RESPONSE,
        }

    async def process_api_error(self, error: dict[str, Any], retry_count: int) -> dict[str, Any]:
        return {"retry": error["status"] == 400 and retry_count == 0}


CACHED_RESPONSE: list[Chunk] = [
    delta("from cache"),
    {
        "type": "finish",
        "payload": {"finishReason": "stop", "usage": {"inputTokens": 0, "outputTokens": 2, "totalTokens": 2}},
    },
]


class Guard(Processor):
    """Aborts with retry, replaces tool results, and emits signals/custom chunks/violations."""

    id = "guard"

    async def process_output_step(self, text: str, abort: Any) -> list[Message]:
        if "forbidden" in text:
            abort("forbidden word in output", retry=True, metadata={"word": "forbidden", "score": 0.9})
        return []

    async def process_tool_result(self, tool_name: str, result: Any) -> Any:
        if tool_name == "secrets":
            return {"redacted": True, "keys": sorted(result)}
        return None

    async def process_llm_response(
        self,
        chunks: list[Chunk],
        send_signal: Any,
        writer: Any,
        report_violation: Any,
        state: dict[str, Any],
    ) -> None:
        text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
        await send_signal(
            {
                "type": "reactive",
                "contents": f"You wrote {len(text)} characters.",
                "tagName": "length-note",
                "attributes": {"zeta": 1, "alpha": "a", "mid": [1, 2]},
            }
        )
        await writer.custom({"type": "data-length", "data": {"chars": len(text)}, "transient": True})
        report_violation("long answer", {"chars": len(text)})
        state["history"].append(len(text))
        state["flags"][f"call{len(state['history'])}"] = True


class Faulty(Processor):
    """Hooks that raise or return what the contract does not allow."""

    id = "faulty"

    async def process_input(self) -> None:
        raise RuntimeError("boom")

    async def process_input_step(self) -> int:
        return 42

    async def process_output_step(self) -> str:
        return "not a list"

    async def process_output_result(self, state: dict[str, Any]) -> None:
        state["tags"] = {"a", "b"}  # a set has no JSON form

    async def process_output_stream(self, part: Chunk) -> Chunk:
        if part["type"] == "text-delta" and part["payload"]["text"] == "boom":
            raise RuntimeError("boom")
        return part


def _recording(hook: str) -> Any:
    async def record(self: Processor, **kwargs: Any) -> None:
        kwargs["state"][hook] = sorted(kwargs)

    return record


class Recorder(Processor):
    """Every hook takes **kwargs and records the argument names it was handed."""

    id = "recorder"
    process_input = _recording("process_input")
    process_input_step = _recording("process_input_step")
    process_llm_request = _recording("process_llm_request")
    process_llm_response = _recording("process_llm_response")
    process_output_stream = _recording("process_output_stream")
    process_output_step = _recording("process_output_step")
    process_tool_result = _recording("process_tool_result")
    process_output_result = _recording("process_output_result")
    process_api_error = _recording("process_api_error")
    execute_tool = _recording("execute_tool")


HOSTED_IDS = ["shouter", "planner", "guard", "censor", "data-censor", "faulty", "recorder"]


def processors() -> list[Processor]:
    return [Shouter(), Planner(), Guard(), Censor(), DataCensor(), Faulty(), Recorder()]


HISTORY = text_message("h1", "user", "earlier")
SYSTEM = text_message("s1", "system", "You are helpful.")


def input_request(options: dict[str, Any] | None = None) -> ppb.ProcessInputRequest:
    new = text_message("u1", "user", "hello", metadata={"lang": "en"})
    return ppb.ProcessInputRequest(
        context=run_context("shouter", options=options, state={"calls": 4}),
        messages=protos(new),
        all_messages=protos(HISTORY, new),
        system_messages=protos(SYSTEM),
    )


TRANSPORTS = pytest.mark.parametrize("transport", ["tcp", "unix"])


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- ProcessOutputStream ------------------------------------------------------------------


def stream_request(parts: list[tuple[int, Chunk]], context: tpb.RunContext | None = None) -> Any:
    req = ppb.ProcessOutputStreamRequest(
        parts=[ppb.StreamPart(seq=seq, part=convert.chunk_to_proto(chunk)) for seq, chunk in parts]
    )
    if context is not None:
        req.context.CopyFrom(context)
    return req


def result_chunks(resp: Any) -> list[tuple[int, Chunk | None]]:
    return [(r.seq, convert.chunk_from_proto(r.part) if r.HasField("part") else None) for r in resp.results]


async def finish(call: Any) -> dict[str, Any]:
    """Read the StreamEnd, check the stream then ends OK, and return the final state."""
    end = await call.read()
    assert end.HasField("end")
    assert len(end.results) == 0
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    return convert.from_struct(end.end.state)
