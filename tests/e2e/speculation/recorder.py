"""Processors that tell what they were given, served as a real sidecar process.

``python -m tests.e2e.speculation.recorder --listen ADDR`` serves:

- ``recorder`` (not speculative): appends one JSON line per hook call to ``options.log``: the
  hook and the text it was given. The speculation tests check it only ever sees final input.
- ``flaky`` (speculative): raises in ``process_input`` and, on a text delta containing
  ``options.word``, in ``process_output_stream``; otherwise passes its input on unchanged.
- ``slow`` (speculative): waits ``options.delay`` seconds in its unary hooks, then returns its
  input unchanged; while it waits it counts itself in flight in ``options.log``'s directory, so a
  test can see two calls overlap without timing anything. In ``process_output_stream`` it waits
  ``options.delay`` per part and passes it on (the speculative members after it answer first).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from procmesh import Processor, run, settings_from_args, settings_parser


def _text(messages: list[dict[str, Any]]) -> str:
    return " | ".join(
        p.get("text", "")
        for m in messages
        if m.get("role") != "system"
        for p in (m.get("content") or {}).get("parts", [])
        if p.get("type") == "text"
    )


def _prompt_text(prompt: list[dict[str, Any]]) -> str:
    return " | ".join(
        p.get("text", "")
        for m in prompt
        if m.get("role") != "system"
        for p in m.get("content") or []
        if isinstance(p, dict) and p.get("type") == "text"
    )


def _append(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


class Recorder(Processor):
    """Records every call's input text (it is not speculative: it must only see final input)."""

    id: ClassVar[str] = "recorder"

    async def process_input(self, messages: list[dict[str, Any]], options: Any) -> None:
        _append(options["log"], {"hook": "process_input", "text": _text(messages)})

    async def process_input_step(self, messages: list[dict[str, Any]], options: Any) -> None:
        _append(options["log"], {"hook": "process_input_step", "text": _text(messages)})

    async def process_llm_request(self, prompt: list[dict[str, Any]], options: Any) -> None:
        _append(options["log"], {"hook": "process_llm_request", "text": _prompt_text(prompt)})

    async def process_output_step(self, messages: list[dict[str, Any]], options: Any) -> None:
        _append(options["log"], {"hook": "process_output_step", "text": _text(messages)})

    async def process_tool_result(self, result: Any, options: Any) -> None:
        _append(options["log"], {"hook": "process_tool_result", "text": json.dumps(result)})

    async def process_output_result(self, messages: list[dict[str, Any]], options: Any) -> None:
        _append(options["log"], {"hook": "process_output_result", "text": _text(messages)})

    async def process_output_stream(self, part: dict[str, Any], options: Any) -> dict[str, Any]:
        text = part["payload"].get("text", "") if part["type"] == "text-delta" else part["type"]
        _append(options["log"], {"hook": "process_output_stream", "text": text})
        return part


class Slow(Processor):
    """Takes `options.delay` seconds and changes nothing; counts the calls in flight."""

    id: ClassVar[str] = "slow"
    speculative: ClassVar[bool] = True
    in_flight: ClassVar[int] = 0

    async def _wait(self, options: Any, hook: str) -> None:
        Slow.in_flight += 1
        try:
            _append(options["log"], {"hook": hook, "in_flight": Slow.in_flight})
            await asyncio.sleep(float(options.get("delay", 0.05)))
        finally:
            Slow.in_flight -= 1

    async def process_input(self, options: Any) -> None:
        await self._wait(options, "process_input")

    async def process_llm_request(self, options: Any) -> None:
        await self._wait(options, "process_llm_request")

    async def process_output_stream(self, part: dict[str, Any], options: Any) -> dict[str, Any]:
        await asyncio.sleep(float(options.get("delay", 0.05)))
        return part


class Flaky(Processor):
    """A speculative processor whose hook fails: its failure policy must apply to it alone."""

    id: ClassVar[str] = "flaky"
    speculative: ClassVar[bool] = True

    async def process_input(self) -> None:
        raise RuntimeError("flaky failed in process_input")

    async def process_output_stream(self, part: dict[str, Any], options: Any) -> dict[str, Any]:
        if part["type"] == "text-delta" and options.get("word", "") in part["payload"].get("text", ""):
            raise RuntimeError("flaky failed on a part")
        return part


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the recorder, slow and flaky processors (what `procmesh.run` does)."""
    parser = settings_parser(prog="python -m tests.e2e.speculation.recorder")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run([Recorder(), Slow(), Flaky()], settings_from_args(args))


if __name__ == "__main__":
    main()
