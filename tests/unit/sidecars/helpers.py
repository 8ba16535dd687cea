"""Stand-ins for the hook arguments the SDK injects, for calling built-in hooks directly."""

from __future__ import annotations

from typing import Any, NoReturn

from procmesh import TripWire


def abort(reason: str | None = None, *, retry: bool = False, metadata: Any = None) -> NoReturn:
    raise TripWire(reason or "Tripwire triggered", retry=retry, metadata=metadata)


class Writer:
    """Collects custom chunks."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []

    async def custom(self, chunk: dict[str, Any]) -> None:
        self.chunks.append(chunk)


class Signals:
    """Collects signals."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, signal: dict[str, Any]) -> None:
        self.sent.append(signal)


class Violations:
    def __init__(self) -> None:
        self.reported: list[tuple[str, Any]] = []

    def __call__(self, message: str, detail: Any = None) -> None:
        self.reported.append((message, detail))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def call(call_id: str, name: str, args: Any = None, text: str = "") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.append({"type": "tool-call", "toolCallId": call_id, "toolName": name, "input": args or {}})
    return {"role": "assistant", "content": parts}


def result(call_id: str, name: str, output: Any) -> dict[str, Any]:
    return {
        "role": "tool",
        "content": [{"type": "tool-result", "toolCallId": call_id, "toolName": name, "output": output}],
    }
