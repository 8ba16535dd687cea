"""Processors for the fused-request and rewind tests, served by the Python SDK in their own process.

    python -m tests.e2e.node.fusion_twins --listen ADDR      (FUSION_SET=leaky: only `leaky`)

Their Node twins are in fusion_twins.mjs. Each reacts to words in its input (``rewrite``,
``signal``, ``stop``, ``boom``, ...) so a test picks the behaviour by the text it sends.
"""

from __future__ import annotations

import os
from typing import Any

import procmesh
from procmesh import Processor

Message = dict[str, Any]


def _text(messages: list[Message]) -> str:
    return " ".join(p.get("text", "") for m in messages for p in m["content"]["parts"] if p["type"] == "text")


class Tally(Processor):
    """Counts what it sees in its state; numbers streamed text; emits a custom chunk on ``emit``."""

    id = "tally"
    speculative = True
    process_data_parts = True

    async def process_input(self, messages: list[Message], state: dict[str, Any], writer: Any) -> None:
        state["calls"] = state.get("calls", 0) + 1
        if "emit" in _text(messages):
            await writer.custom({"type": "data-tally", "data": {"calls": state["calls"]}})

    async def process_output_stream(
        self, part: dict[str, Any], state: dict[str, Any], stream_parts: list[Any], writer: Any
    ) -> Any:
        state["n"] = state.get("n", 0) + 1
        if part["type"].startswith("data-"):
            return {**part, "data": {"seen": part.get("data"), "n": state["n"]}}
        text = part["payload"].get("text", "")
        if "emit" in text:
            await writer.custom({"type": "data-tally", "data": {"n": state["n"]}})
        return {**part, "payload": {**part["payload"], "text": f"{text}#{state['n']}/{len(stream_parts)}"}}


class Shout(Processor):
    """Rewrites, signals, aborts, fails or splits, by the words of its input."""

    id = "shout"
    speculative = True

    async def process_input(
        self, messages: list[Message], state: dict[str, Any], send_signal: Any, abort: Any
    ) -> Any:
        text = _text(messages)
        state["seen"] = state.get("seen", 0) + 1
        if "stop" in text:
            abort("shout stops here", metadata={"at": "input"})
        if "boom" in text:
            raise RuntimeError("shout exploded")
        if "signal" in text:
            await send_signal({"type": "reactive", "contents": "heard you", "attributes": {"k": "v"}})
        if "rewrite" in text:
            return [
                {**m, "content": {**m["content"], "parts": [{"type": "text", "text": "REWRITTEN"}]}}
                for m in messages
            ]
        return None

    async def process_output_stream(
        self, part: dict[str, Any], state: dict[str, Any], send_signal: Any, abort: Any
    ) -> Any:
        state["n"] = state.get("n", 0) + 1
        text = part["payload"].get("text", "")
        if "stop" in text:
            abort("shout stops the stream")
        if "boom" in text:
            raise RuntimeError("shout exploded")
        if "drop" in text:
            return None
        if "sig" in text:
            await send_signal({"type": "notification", "contents": f"saw {text}"})
        if "split" in text:
            return [{**part, "payload": {**part["payload"], "text": w}} for w in text.split()]
        return {**part, "payload": {**part["payload"], "text": text.upper()}}


class Plain(Processor):
    """Not speculative: passes everything on and counts."""

    id = "plain"

    async def process_input(self, state: dict[str, Any]) -> None:
        state["calls"] = state.get("calls", 0) + 1

    async def process_output_stream(self, part: dict[str, Any], state: dict[str, Any]) -> Any:
        state["n"] = state.get("n", 0) + 1
        return part


class Leaky(Processor):
    """Declares speculative but counts in an attribute, not in `state`: a rewind cannot undo it."""

    id = "leaky"
    speculative = True

    def __init__(self) -> None:
        self.count = 0

    async def process_output_stream(self, part: dict[str, Any], state: dict[str, Any]) -> Any:
        self.count += 1
        state["n"] = self.count
        return {
            **part,
            "payload": {**part["payload"], "text": f"{part['payload'].get('text', '')}#{self.count}"},
        }


if __name__ == "__main__":
    procmesh.run([Leaky()] if os.environ.get("FUSION_SET") == "leaky" else [Tally(), Shout(), Plain()])
