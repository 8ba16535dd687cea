"""The property test's sidecar: one speculative processor whose behaviour its options choose.

Every lane entry is an instance of ``prog`` (its own name, so its own state and tripwire id) with
options ``{"name", "kind", "token", "with"}``; ``kind`` is one of `KINDS`:

- ``pass``: returns everything unchanged;
- ``rewrite``: replaces ``token`` by ``with`` (message text in processInputStep, a text delta in
  processOutputStream, the assistant's text in processOutputResult);
- ``drop``: drops the messages (processInputStep) or text deltas holding ``token``;
- ``abort``: aborts where ``token`` appears (all three hooks);
- ``count``: counts every call in its state and, where ``token`` appears, emits a
  ``data-count`` chunk with the count so far (processInputStep and processOutputStream);
- ``custom``: emits a ``data-mark`` chunk where ``token`` appears (same two hooks).

Each call is recorded as one JSON line in the file the request context names (``log``): who was
called, with what input and state, in which run (``example``, ``mode``). The test reads it to
check that a processor whose speculation is off only ever receives its final input. Run as
``python -m tests.e2e.speculation_property.processors --listen ADDRESS``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from procmesh import Processor, ProcessorSettings, run

KINDS = ("pass", "rewrite", "drop", "abort", "count", "custom")


def _text(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["content"].get("parts", []) if p.get("type") == "text")


def _rewritten(message: dict[str, Any], token: str, new: str) -> dict[str, Any]:
    parts = [
        {**p, "text": p["text"].replace(token, new)} if p.get("type") == "text" else p
        for p in message["content"].get("parts", [])
    ]
    return {**message, "content": {**message["content"], "parts": parts}}


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


class Programmable(Processor):
    """``prog``: what it does is its options' `kind` (module docstring)."""

    id = "prog"
    speculative = True

    async def _record(self, hook: str, text: str, options: Any, state: Any, context: Any) -> None:
        line = json.dumps(
            {
                "example": context["example"],
                "mode": context["mode"],
                "who": options["name"],
                "hook": hook,
                "input": text,
                "state": dict(state),
            },
            sort_keys=True,
        )
        await asyncio.to_thread(_append, context["log"], line)

    async def _effects(self, text: str, options: Any, state: Any, abort: Any, writer: Any) -> None:
        """The kinds that act the same in every hook: abort, count, custom."""
        kind, token = options["kind"], options["token"]
        if kind == "count":
            state["n"] = state.get("n", 0) + 1
        if token not in text:
            return
        if kind == "abort":
            abort(f"{options['name']} saw {token!r}")
        elif kind == "count":
            await writer.custom({"type": "data-count", "data": {"by": options["name"], "n": state["n"]}})
        elif kind == "custom":
            await writer.custom({"type": "data-mark", "data": {"by": options["name"], "text": text}})

    async def process_input_step(
        self, messages: Any, options: Any, state: Any, abort: Any, writer: Any, request_context: Any
    ) -> Any:
        text = "|".join(_text(m) for m in messages if m["role"] != "system")
        await self._record("process_input_step", text, options, state, request_context)
        await self._effects(text, options, state, abort, writer)
        kind, token = options["kind"], options["token"]
        if kind == "rewrite" and token in text:
            return {"messages": [_rewritten(m, token, options["with"]) for m in messages]}
        if kind == "drop" and token in text:
            return {"messages": [m for m in messages if token not in _text(m)]}
        return None

    async def process_output_stream(
        self, part: Any, options: Any, state: Any, abort: Any, writer: Any, request_context: Any
    ) -> Any:
        text = part["payload"].get("text", "") if part["type"] == "text-delta" else ""
        await self._record("process_output_stream", f"{part['type']}:{text}", options, state, request_context)
        await self._effects(text, options, state, abort, writer)
        kind, token = options["kind"], options["token"]
        if token in text and kind == "drop":
            return None
        if token in text and kind == "rewrite":
            return {**part, "payload": {**part["payload"], "text": text.replace(token, options["with"])}}
        return part

    async def process_output_result(
        self, messages: Any, options: Any, state: Any, abort: Any, request_context: Any
    ) -> Any:
        text = "|".join(_text(m) for m in messages if m["role"] == "assistant")
        await self._record("process_output_result", text, options, state, request_context)
        kind, token = options["kind"], options["token"]
        if token not in text:
            return None
        if kind == "abort":
            abort(f"{options['name']} saw {token!r} in the result")
        if kind == "rewrite":
            new = options["with"]
            return [_rewritten(m, token, new) if m["role"] == "assistant" else m for m in messages]
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", action="append", required=True)
    args = parser.parse_args()
    run([Programmable()], ProcessorSettings(listen=args.listen, log_level="WARNING"))


if __name__ == "__main__":
    main()
