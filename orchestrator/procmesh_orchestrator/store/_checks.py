"""What the store checks and encodes the same way on both backends, before any SQL runs.

Arguments are checked first, so a bad id or an oversized message is an `InvalidMemoryInputError`
and never a half-written turn or a driver error; bodies are encoded as ASCII JSON text (lone
surrogates and NUL characters escaped), which both SQLite and PostgreSQL text columns store as is.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store.runs import DurableRun, SuspendedRun

MAX_ID_CHARS = 256
"""Longest thread, resource or message id (UUIDs are 36; room for prefixed and composed ids)."""
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest stored message, as JSON: the orchestrator's default request limit."""
DEFAULT_MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""Largest suspended-run snapshot, as JSON: a whole run's messages and state."""
MAX_PAGE = 10_000


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


def check_optional_id(store: str, kind: str, value: object) -> str:
    """An id that may be "" (none)."""
    return "" if value == "" else check_id(store, kind, value)


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


def encode_snapshot(store: str, where: str, snapshot: object, max_bytes: int) -> str:
    """A run's snapshot (an object) as JSON text, refused when it is not JSON or too large."""
    if not isinstance(snapshot, dict):
        raise InvalidMemoryInputError(
            f"memory store {store}: {where}: the snapshot must be an object, not {type(snapshot).__name__}"
        )
    return encode_json(store, f"{where}: the snapshot", snapshot, max_bytes)


def run_owners(store: str, where: str, run: SuspendedRun | DurableRun) -> tuple[str, str, str]:
    """A run's ``(agent_id, thread_id, resource_id)``, checked (the last two may be "")."""
    return (
        check_id(store, f"{where}: agent", run.agent_id),
        check_optional_id(store, f"{where}: thread", run.thread_id),
        check_optional_id(store, f"{where}: resource", run.resource_id),
    )


def check_date(store: str, name: str, value: object) -> datetime | None:
    """An ISO 8601 bound (None: no bound); without an offset it is UTC."""
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise TypeError(f"not {type(value).__name__}")
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError) as exc:
        raise InvalidMemoryInputError(
            f"memory store {store}: {name} must be an ISO 8601 date or time, got {label(value)}"
        ) from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def iso(moment: datetime) -> str:
    """A timestamp as JavaScript's ``Date.toISOString()`` writes it (what @mastra/client-js reads)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


_TEXT_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def time_text(moment: datetime) -> str:
    """A timestamp, UTC, to the microsecond, in a fixed-width form whose text order is time order."""
    return moment.astimezone(UTC).strftime(_TEXT_TIME)


def now_text() -> str:
    """Now, as `time_text` writes it."""
    return time_text(datetime.now(UTC))


def iso_from_text(text: str) -> str:
    """A stored `now_text` timestamp as `iso` renders it."""
    return iso(datetime.strptime(text, _TEXT_TIME).replace(tzinfo=UTC))


def decode(body: str) -> Any:
    """A stored JSON body."""
    return json.loads(body)
