"""The Python twins of tests/e2e/node/contract.mjs's processors, served by the Python SDK in
test_sdk_parity.py's process: `Echo` records everything its hooks are handed into its state and
returns it unchanged; `Effects`, `Faulty` and `Strict` answer with results, effects, failures and
options the Node twins must match.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel

from procmesh import MessageList, Processor, TripWire

Message = dict[str, Any]


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


_SKIP = {"abort", "release", "send_signal", "writer", "report_violation", "message_list", "state", "model"}


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
