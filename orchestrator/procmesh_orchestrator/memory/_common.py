"""What both stores check and encode the same way, before any SQL runs.

Arguments are checked first, so a bad id or an oversized message is an `InvalidMemoryInputError`
and never a half-written turn or a driver error; bodies are encoded as ASCII JSON text (lone
surrogates and NUL characters escaped), which both SQLite and PostgreSQL text columns store as is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from procmesh_orchestrator.errors import InvalidMemoryInputError, ThreadOwnershipError
from procmesh_orchestrator.memory.store import Message

T = TypeVar("T")

MAX_ID_CHARS = 256
"""Longest thread, resource or message id (UUIDs are 36; room for prefixed and composed ids)."""
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest stored message, as JSON: the orchestrator's default request limit."""
MAX_TITLE_CHARS = 1024
MAX_PAGE = 10_000
SIGNAL_ROLE = "signal"


def label(value: object) -> str:
    """An id as error messages show it: quoted, and cut short when it is huge."""
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"...' ({len(str(value))} chars)"


def check_id(store: str, kind: str, value: object) -> str:
    """`value` when it is a usable id: a non-empty printable string of at most `MAX_ID_CHARS`."""
    problem = None
    if not isinstance(value, str):
        problem = f"must be a string, not {type(value).__name__}"
    elif not value:
        problem = "must not be empty"
    elif len(value) > MAX_ID_CHARS:
        problem = f"is {len(value)} characters long, more than the {MAX_ID_CHARS} allowed"
    elif not value.isprintable():
        problem = "contains control or unprintable characters"
    if problem is not None:
        raise InvalidMemoryInputError(f"memory store {store}: {kind} id {label(value)} {problem}")
    assert isinstance(value, str)
    return value


def check_count(store: str, name: str, value: object, *, low: int, high: int) -> int:
    """An integer argument (`last`, `limit`, `offset`) within bounds; booleans are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidMemoryInputError(
            f"memory store {store}: {name} must be an integer from {low} to {high}, got {label(value)}"
        )
    return value


def encode_json(store: str, what: str, value: object, max_bytes: int) -> str:
    """`value` as compact ASCII JSON, refused when it is not JSON-able or longer than `max_bytes`."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMemoryInputError(f"memory store {store}: {what} is not JSON: {exc}") from exc
    if len(text) > max_bytes:
        raise InvalidMemoryInputError(
            f"memory store {store}: {what} is {len(text)} bytes as JSON, more than the {max_bytes} allowed"
        )
    return text


def encode_turn(
    store: str, thread_id: str, resource_id: str, messages: object, max_bytes: int
) -> list[tuple[str, str, str]]:
    """The turn as ``(id, role, body)`` rows, every message checked before any is written."""
    if not isinstance(messages, list):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread {label(thread_id)}: a turn is a list of messages, "
            f"not {type(messages).__name__}"
        )
    rows = []
    for index, message in enumerate(messages):
        where = f"thread {label(thread_id)}: message {index}"
        if not isinstance(message, dict):
            raise InvalidMemoryInputError(
                f"memory store {store}: {where} must be an object, not {type(message).__name__}"
            )
        message_id = check_id(store, f"{where}:", message.get("id"))
        role = message.get("role")
        if not isinstance(role, str) or not role or len(role) > 64:
            raise InvalidMemoryInputError(f"memory store {store}: {where} has no valid role: {label(role)}")
        stored: Message = {**message, "threadId": thread_id, "resourceId": resource_id}
        rows.append((message_id, role, encode_json(store, where, stored, max_bytes)))
    return rows


def check_thread_fields(store: str, title: object, metadata: object, max_bytes: int) -> tuple[str, str]:
    """A thread's title and metadata (as JSON text), checked."""
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise InvalidMemoryInputError(
            f"memory store {store}: a thread title must be a string of at most {MAX_TITLE_CHARS} characters"
        )
    if not isinstance(metadata, dict):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread metadata must be an object, not {type(metadata).__name__}"
        )
    return title, encode_json(store, "thread metadata", metadata, max_bytes)


def iso(moment: datetime) -> str:
    """A timestamp as JavaScript's ``Date.toISOString()`` writes it (what @mastra/client-js reads)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def now_text() -> str:
    """Now, UTC, to the microsecond, in a fixed-width form whose text order is time order."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_from_text(text: str) -> str:
    """A stored `now_text` timestamp as `iso` renders it."""
    return iso(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC))


def decode(body: str) -> Any:
    """A stored JSON body."""
    return json.loads(body)


async def shielded(work: Coroutine[Any, Any, T]) -> T:
    """Run a write to its end even when the caller is cancelled (a run's timeout, a client gone).

    The transaction is atomic anyway; finishing it keeps the connection out of a half-open
    transaction that the next caller would inherit. A failure nobody awaits any more is retrieved
    so that asyncio does not report it as lost.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise


def check_owner(store: str, thread_id: str, owner: str, resource_id: str) -> None:
    """Refuse a thread of another resource (the message does not say whose it is)."""
    if owner != resource_id:
        raise ThreadOwnershipError(
            f"memory store {store}: thread {label(thread_id)} belongs to another resource"
        )


def messages_query(
    store: str, thread_id: str, last: int | None, include_signals: bool, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read a thread's messages, oldest first (all, or the `last` N);
    the backends differ only in their placeholder (``?`` or ``%s``)."""
    p = placeholder
    where = f"thread_id = {p}" if include_signals else f"thread_id = {p} AND role <> {p}"
    args: tuple[Any, ...] = (thread_id,) if include_signals else (thread_id, SIGNAL_ROLE)
    if last is None:
        return f"SELECT body FROM messages WHERE {where} ORDER BY seq", args
    args = (*args, check_count(store, "last", last, low=0, high=2**62))
    sql = (
        f"SELECT body FROM (SELECT seq, body FROM messages WHERE {where} "
        f"ORDER BY seq DESC LIMIT {p}) AS window_ ORDER BY seq"
    )
    return sql, args
