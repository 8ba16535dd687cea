"""What makes a sidecar's answers malformed for the orchestrator (pure functions over messages)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from procmesh import convert
from procmesh._check.requests import NEW_KIND_MESSAGE_ID, NEW_KIND_PART, RETRYABLE, STREAM
from procmesh.v1 import types_pb2 as tpb

SIGNAL_TYPES = {"", "reactive", "user", "notification", "state", "system-reminder", "user-message"}


def _message_problems(what: str, messages: Sequence[tpb.Message]) -> list[str]:
    problems = []
    for i, msg in enumerate(messages):
        if not msg.role:
            problems.append(f"{what}[{i}] has no role")
        for j, part in enumerate(msg.content.parts):
            if part.WhichOneof("kind") is None and part.SerializeToString() != NEW_KIND_PART:
                problems.append(f"{what}[{i}] part {j} has no kind")
    return problems


def new_kind_problems(resp: Any) -> list[str]:
    """The checker's part of a newer kind, wherever the response returns its message, unchanged."""
    problems = []
    for name in ("messages", "all_messages", "system_messages"):
        for msg in getattr(resp, name, ()):
            if msg.id != NEW_KIND_MESSAGE_ID:
                continue
            if not any(p.SerializeToString() == NEW_KIND_PART for p in msg.content.parts):
                problems.append(
                    f"{name} returns message {msg.id!r} without its part of a newer kind, as sent"
                )
    return problems


def effects_problems(effects: tpb.HookEffects) -> list[str]:
    """What makes a response's effects malformed for the orchestrator."""
    problems = []
    for chunk in effects.custom_chunks:
        if not chunk.type.startswith("data-"):
            problems.append(f"custom chunk type {chunk.type!r} does not start with 'data-'")
    for signal in effects.signals:
        if not signal.contents and not signal.type:
            problems.append("a signal has neither type nor contents")
        elif signal.type not in SIGNAL_TYPES:
            problems.append(f"unknown signal type {signal.type!r}")
    return problems


def response_problems(hook: str, resp: Any) -> list[str]:
    """Malformed effects or replacement data in a unary response."""
    problems = effects_problems(resp.effects)
    for name in ("messages", "all_messages", "system_messages"):
        if hasattr(resp, name):
            problems += _message_problems(name, getattr(resp, name))
    if hook == "ProcessLLMRequest":
        for chunk in resp.cached_response:
            if not chunk.type:
                problems.append("a cached_response chunk has no type")
    return problems


def abort_problems(hook: str, abort: tpb.Abort) -> tuple[list[str], str]:
    """Problems of an Abort, and a description of it."""
    problems = []
    try:
        metadata = convert.from_value(abort.metadata) if abort.HasField("metadata") else None
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        problems.append(f"metadata is not JSON: {exc}")
        metadata = "?"
    reason = abort.reason or "(empty: the orchestrator uses 'Tripwire triggered by <id>')"
    desc = f"{hook}: reason {reason!r}, retry={abort.retry}, metadata={json.dumps(metadata)}"
    if abort.retry and hook not in RETRYABLE and hook != STREAM:
        desc += " (retry only replays ProcessInputStep/ProcessOutputStep; here it is kept in the tripwire)"
    return problems, desc
