"""What both stores check and encode the same way, before any SQL runs.

Arguments are checked first, so a bad id or an oversized message is an `InvalidMemoryInputError`
and never a half-written turn or a driver error; bodies are encoded as ASCII JSON text (lone
surrogates and NUL characters escaped), which both SQLite and PostgreSQL text columns store as is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    ResumeConflictError,
    SuspendedRunNotFoundError,
)
from procmesh_orchestrator.store.store import (
    RESUMED,
    RESUMING,
    SUSPENDED,
    DurableRun,
    Message,
    SuspendedRun,
)

T = TypeVar("T")
R = TypeVar("R")
Query = Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]]
"""Runs one statement in the current transaction and returns its rows ([] when it has none)."""

MAX_ID_CHARS = 256
"""Longest thread, resource or message id (UUIDs are 36; room for prefixed and composed ids)."""
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest stored message, as JSON: the orchestrator's default request limit."""
DEFAULT_MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""Largest suspended-run snapshot, as JSON: a whole run's messages and state."""
MAX_TITLE_CHARS = 1024
MAX_TOOL_CALLS = 1024
"""Most tool calls one suspended run may await."""
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


def thread_key(store: str, thread_id: object, resource_id: object) -> tuple[str, str]:
    """A thread's key, ``(resource_id, thread_id)``: thread ids are scoped by resource. Both ids
    are checked (the thread's first)."""
    thread = check_id(store, "thread", thread_id)
    return check_id(store, "resource", resource_id), thread


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


def messages_query(
    store: str, thread_id: str, resource_id: str, last: int | None, include_signals: bool, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read a resource's thread's messages, oldest first (all, or the
    `last` N), in one statement filtered on the resource: another resource's thread of the same id
    is never read. The backends differ only in their placeholder (``?`` or ``%s``)."""
    p = placeholder
    where = f"resource_id = {p} AND thread_id = {p}"
    args: tuple[Any, ...] = (resource_id, thread_id)
    if not include_signals:
        where, args = f"{where} AND role <> {p}", (*args, SIGNAL_ROLE)
    if last is None:
        return f"SELECT body FROM messages WHERE {where} ORDER BY seq", args
    args = (*args, check_count(store, "last", last, low=0, high=2**62))
    sql = (
        f"SELECT body FROM (SELECT seq, body FROM messages WHERE {where} "
        f"ORDER BY seq DESC LIMIT {p}) AS window_ ORDER BY seq"
    )
    return sql, args


# --- suspended runs ------------------------------------------------------------------------------

SUSPENDED_COLUMNS = "run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot, status, created_at"


def check_optional_id(store: str, kind: str, value: object) -> str:
    """An id that may be "" (none)."""
    return "" if value == "" else check_id(store, kind, value)


def encode_suspended(store: str, run: object, max_bytes: int) -> tuple[str, str, str, str, str, str]:
    """A run to save as ``(run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot)``
    (the last two as JSON text), every field checked before anything is written."""
    if not isinstance(run, SuspendedRun):
        raise InvalidMemoryInputError(
            f"memory store {store}: a suspended run is a SuspendedRun, not {type(run).__name__}"
        )
    run_id = check_id(store, "run", run.run_id)
    where = f"suspended run {label(run_id)}"
    calls = run.tool_call_ids
    if not isinstance(calls, tuple | list) or not 1 <= len(calls) <= MAX_TOOL_CALLS:
        raise InvalidMemoryInputError(
            f"memory store {store}: {where}: tool_call_ids must be a tuple of 1 to {MAX_TOOL_CALLS} ids"
        )
    checked = [check_id(store, f"{where}: tool call", call) for call in calls]
    agent_id, thread_id, resource_id = run_owners(store, where, run)
    tool_call_ids = encode_json(store, f"{where}: tool_call_ids", checked, max_bytes)
    snapshot = encode_snapshot(store, where, run.snapshot, max_bytes)
    return run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot


def run_owners(store: str, where: str, run: SuspendedRun | DurableRun) -> tuple[str, str, str]:
    """A run's ``(agent_id, thread_id, resource_id)``, checked (the last two may be "")."""
    return (
        check_id(store, f"{where}: agent", run.agent_id),
        check_optional_id(store, f"{where}: thread", run.thread_id),
        check_optional_id(store, f"{where}: resource", run.resource_id),
    )


def encode_snapshot(store: str, where: str, snapshot: object, max_bytes: int) -> str:
    """A run's snapshot (an object) as JSON text, refused when it is not JSON or too large."""
    if not isinstance(snapshot, dict):
        raise InvalidMemoryInputError(
            f"memory store {store}: {where}: the snapshot must be an object, not {type(snapshot).__name__}"
        )
    return encode_json(store, f"{where}: the snapshot", snapshot, max_bytes)


def save_suspended_sql(p: str, created_at: str) -> str:
    """Insert a run, or replace the one of its id (claimed or not) with a fresh suspension."""
    return (
        f"INSERT INTO suspended_runs ({SUSPENDED_COLUMNS}) "
        f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, '{SUSPENDED}', {created_at}) "
        "ON CONFLICT (run_id) DO UPDATE SET agent_id = excluded.agent_id, "
        "thread_id = excluded.thread_id, resource_id = excluded.resource_id, "
        "tool_call_ids = excluded.tool_call_ids, snapshot = excluded.snapshot, "
        "status = excluded.status, created_at = excluded.created_at"
    )


def select_suspended_sql(p: str) -> str:
    """Read one run by id."""
    return f"SELECT {SUSPENDED_COLUMNS} FROM suspended_runs WHERE run_id = {p}"


def set_status_sql(p: str, status: str) -> str:
    """Move a run to `status` (a release only touches a claimed run)."""
    only = f" AND status = '{RESUMING}'" if status == SUSPENDED else ""
    return f"UPDATE suspended_runs SET status = '{status}' WHERE run_id = {p}{only}"


def suspended_run(row: Any, when: Callable[[Any], str]) -> SuspendedRun:
    """A stored row as a run; `when` renders the backend's ``created_at`` as ISO 8601."""
    run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot, status, created_at = row
    return SuspendedRun(
        run_id=run_id,
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        tool_call_ids=tuple(decode(tool_call_ids)),
        snapshot=decode(snapshot),
        created_at=when(created_at),
        status=status,
    )


def claim(
    store: str,
    run_id: str,
    tool_call_id: str,
    rows: list[Any],
    when: Callable[[Any], str],
    resource_id: str | None = None,
) -> SuspendedRun:
    """The run a claim takes, from its row as read under the write lock: it must exist (and be
    `resource_id`'s, when given: another resource's is missing, whatever its state), await
    `tool_call_id` and not be claimed already. The caller then marks it `RESUMING`."""
    run = suspended_run(rows[0], when) if rows else None
    if run is None or (resource_id is not None and run.resource_id != resource_id):
        raise SuspendedRunNotFoundError(f"memory store {store}: no suspended run {label(run_id)}")
    if tool_call_id not in run.tool_call_ids:
        raise SuspendedRunNotFoundError(
            f"memory store {store}: suspended run {label(run_id)} awaits no tool call {label(tool_call_id)}"
        )
    if run.status != SUSPENDED:
        doing = "was already resumed" if run.status == RESUMED else "is already being resumed"
        raise ResumeConflictError(f"memory store {store}: suspended run {label(run_id)} {doing}")
    return replace(run, status=RESUMING)


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


_MS = timedelta(milliseconds=1)


def _millisecond(moment: datetime) -> datetime:
    """The start of `moment`'s millisecond."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def list_suspended_query(
    store: str,
    agent_id: object,
    filters: Mapping[str, object],
    page: object,
    per_page: object,
    placeholder: str,
    moment: Callable[[datetime], Any],
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read one page of an agent's runs, newest first, each row led by
    the count of all that match (a page past the end gives one row: the count, then NULLs).

    `filters` holds ``thread_id``, ``resource_id``, ``from_date`` and ``to_date``; `moment` turns a
    bound into the backend's ``created_at`` parameter. Both bounds are inclusive of ``created_at``
    as the store reports it (`iso`, to the millisecond, while it stores microseconds), so a run's
    own ``created_at`` given as either bound selects it.
    """
    p = placeholder
    where, args = [f"agent_id = {p}", f"status <> '{RESUMED}'"], [check_id(store, "agent", agent_id)]
    for kind in ("thread", "resource"):
        value = filters.get(f"{kind}_id")
        if value is not None:
            where.append(f"{kind}_id = {p}")
            args.append(check_optional_id(store, kind, value))
    low, high = (
        check_date(store, "from_date", filters.get("from_date")),
        check_date(store, "to_date", filters.get("to_date")),
    )
    if low is not None:  # reported >= low: stored from the first whole millisecond at or after low
        first = _millisecond(low)
        where.append(f"created_at >= {p}")
        args.append(moment(first if first == low else first + _MS))
    if high is not None:  # reported <= high: stored before the end of high's millisecond
        where.append(f"created_at < {p}")
        args.append(moment(_millisecond(high) + _MS))
    size = check_count(store, "per_page", per_page, low=1, high=MAX_PAGE)
    number = check_count(store, "page", page, low=0, high=2**62 // MAX_PAGE)
    sql = page_sql("suspended_runs", SUSPENDED_COLUMNS, " AND ".join(where), "created_at, run_id", p)
    return sql, (*args, *args, size, number * size)


def page_sql(table: str, columns: str, condition: str, newest: str, p: str) -> str:
    """One page of `table`'s rows that meet `condition`, ordered by the `newest` columns descending,
    each row led by the count of all that match (a page past the end gives one row: the count,
    then NULLs). The arguments are the condition's twice, then LIMIT and OFFSET. A column may be
    ``expression AS name``."""
    names = [col.rsplit(" AS ", 1)[-1] for col in columns.split(", ")]
    order = newest.split(", ")
    selected = ", ".join([columns, *(col for col in order if col not in names)])
    return (
        f"SELECT total.n, {', '.join('run.' + name for name in names)} "
        f"FROM (SELECT count(*) AS n FROM {table} WHERE {condition}) AS total "
        f"LEFT JOIN (SELECT {selected} FROM {table} WHERE {condition} "
        f"ORDER BY {', '.join(col + ' DESC' for col in order)} LIMIT {p} OFFSET {p}) AS run "
        f"ON 1 = 1 ORDER BY {', '.join('run.' + col + ' DESC' for col in order)}"
    )


def page_of(rows: list[Any], make: Callable[[Any], R]) -> tuple[list[R], int]:
    """The items and the total from the rows of a `page_sql` query."""
    total = int(rows[0][0]) if rows else 0
    return [make(row[1:]) for row in rows if row[1] is not None], total


class StoreHooks:
    """What the shared methods need of a backend: its name, its placeholder, and its reads and
    writes (each one transaction)."""

    name: str
    placeholder: str
    """The driver's SQL parameter placeholder (``?``, ``%s``)."""

    async def _read(self, sql: str, args: tuple[Any, ...], doing: str) -> list[Any]:
        raise NotImplementedError

    async def _execute(self, sql: str, args: tuple[Any, ...], doing: str) -> None:
        raise NotImplementedError

    async def _transact(self, work: Callable[[Query], Awaitable[T]], doing: str) -> T:
        """`work` in one write transaction; it runs its statements through the `Query` it is given."""
        raise NotImplementedError


class SuspendedRunMethods(StoreHooks):
    """The suspended-run methods that are the same SQL on both backends, given the backend's
    placeholder, its one-statement read and write, and its ``created_at`` conversions."""

    def _created_at(self, stored: Any) -> str:
        """A stored ``created_at`` as ISO 8601."""
        raise NotImplementedError

    def _time_arg(self, moment: datetime) -> Any:
        """A time as a parameter compared with ``created_at``."""
        raise NotImplementedError

    async def release_suspended(self, run_id: str) -> None:
        """Put a claimed run back to `SUSPENDED`."""
        run_id = check_id(self.name, "run", run_id)
        sql = set_status_sql(self.placeholder, SUSPENDED)
        await self._execute(sql, (run_id,), f"releasing suspended run {run_id!r}")

    async def finish_suspended(self, run_id: str) -> None:
        """The resumed run ended: drop its snapshot, keep its id as `RESUMED` (a late decision on
        it is then a conflict, not a run that never was)."""
        run_id = check_id(self.name, "run", run_id)
        sql = (
            f"UPDATE suspended_runs SET status = '{RESUMED}', snapshot = '{{}}' "
            f"WHERE run_id = {self.placeholder}"
        )
        await self._execute(sql, (run_id,), f"finishing suspended run {run_id!r}")

    async def delete_suspended(self, run_id: str) -> None:
        """Forget the run."""
        run_id = check_id(self.name, "run", run_id)
        sql = f"DELETE FROM suspended_runs WHERE run_id = {self.placeholder}"
        await self._execute(sql, (run_id,), f"deleting suspended run {run_id!r}")

    async def list_suspended(
        self,
        agent_id: str,
        *,
        thread_id: str | None = None,
        resource_id: str | None = None,
        from_date: str | None = None,
        to_date: str | None = None,
        page: int = 0,
        per_page: int = 20,
    ) -> tuple[list[SuspendedRun], int]:
        """One page of the agent's runs, newest first, and the count of all that match."""
        filters = {
            "thread_id": thread_id,
            "resource_id": resource_id,
            "from_date": from_date,
            "to_date": to_date,
        }
        sql, args = list_suspended_query(
            self.name, agent_id, filters, page, per_page, self.placeholder, self._time_arg
        )
        rows = await self._read(sql, args, f"listing the suspended runs of agent {agent_id!r}")
        return page_of(rows, lambda row: suspended_run(row, self._created_at))


MAX_COST_WINDOW_SECONDS = 366 * 86400
"""The longest cost window: usage older than this is never read again, so an admission prunes it
(cost control's ledger: `_ledger`)."""
