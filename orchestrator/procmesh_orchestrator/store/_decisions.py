"""The decision record in both stores: one INSERT of a run's decisions, and the retention's purge
in the same transaction (so a store under load prunes as it writes, without a job of its own)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store._checks import (
    MAX_PAGE,
    check_count,
    check_date,
    check_id,
    iso_from_text,
    label,
    time_text,
)
from procmesh_orchestrator.store._sql import Query, StoreHooks
from procmesh_orchestrator.store.decisions import Decision, RecordedInput

_TEXT_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
"""`time_text`'s form: a fixed width, so text order is time order."""
_BATCH = 400
"""Rows per INSERT statement: a run's thousand stream parts are a few statements, not a thousand
(16 parameters a row stay far below SQLite's limit of 32766)."""
_INPUT_COLUMNS = "run_id, agent_id, thread_id, resource_id, kind, step, body, at"
_COLUMNS = (
    "run_id, agent_id, thread_id, resource_id, processor, sidecar, entry, hook, step, part, "
    "outcome, would, latency_ms, seen, content, at"
)


def _stored_time(at: str) -> str:
    """An ISO 8601 time as `time_text` stores it (`DecisionLog` writes that form: kept as is)."""
    if _TEXT_TIME.fullmatch(at):
        return at
    return time_text(datetime.fromisoformat(at.replace("Z", "+00:00")))


def _row(d: Decision) -> tuple[Any, ...]:
    at = _stored_time(d.at)
    return (
        d.run_id, d.agent_id, d.thread_id, d.resource_id, d.processor, d.sidecar, d.entry, d.hook,
        d.step, d.part, d.outcome, d.would, d.latency_ms, d.seen, d.content, at,
    )  # fmt: skip


def _decision(row: Any) -> Decision:
    (run_id, agent_id, thread_id, resource_id, processor, sidecar, entry, hook, step, part,
     outcome, would, latency_ms, seen, content, at) = row  # fmt: skip
    return Decision(
        run_id=run_id,
        agent_id=agent_id,
        processor=processor,
        sidecar=sidecar,
        entry=entry,
        hook=hook,
        step=int(step),
        outcome=outcome,
        at=iso_from_text(at),
        latency_ms=float(latency_ms),
        part=None if part is None else int(part),
        would=would,
        seen=seen,
        content=content,
        thread_id=thread_id,
        resource_id=resource_id,
    )


class DecisionMethods(StoreHooks):
    """`DecisionStore` on both backends: the same SQL, times as fixed-width ISO text."""

    async def save_decisions(
        self,
        decisions: Sequence[Decision],
        *,
        retention_seconds: float,
        inputs: Sequence[RecordedInput] = (),
    ) -> None:
        """Insert `decisions` and `inputs` and purge those older than the retention, in one
        transaction."""
        if isinstance(retention_seconds, bool) or not (
            isinstance(retention_seconds, int | float) and math.isfinite(retention_seconds)
        ):
            raise InvalidMemoryInputError(
                f"memory store {self.name}: retention_seconds must be a number, "
                f"got {label(retention_seconds)}"
            )
        rows = [_row(d) for d in decisions]
        kept = [
            (i.run_id, i.agent_id, i.thread_id, i.resource_id, i.kind, i.step, i.body, _stored_time(i.at))
            for i in inputs
        ]
        for run_id in {row[0] for row in rows} | {row[0] for row in kept}:
            check_id(self.name, "run", run_id)
        p = self.placeholder
        row_sql = f"({', '.join([p] * 16)})"
        cutoff = time_text(datetime.now(UTC) - timedelta(seconds=max(0.0, retention_seconds)))

        async def save(query: Query) -> None:
            await query(f"DELETE FROM run_decisions WHERE at < {p}", (cutoff,))
            await query(f"DELETE FROM run_inputs WHERE at < {p}", (cutoff,))
            for row in kept:
                await query(f"INSERT INTO run_inputs ({_INPUT_COLUMNS}) VALUES ({', '.join([p] * 8)})", row)
            for start in range(0, len(rows), _BATCH):
                batch = rows[start : start + _BATCH]
                values = ", ".join([row_sql] * len(batch))
                args = tuple(value for row in batch for value in row)
                await query(f"INSERT INTO run_decisions ({_COLUMNS}) VALUES {values}", args)

        await self._transact(save, f"saving {len(rows)} decisions")

    async def run_decisions(self, run_id: str) -> list[Decision]:
        """A run's decisions in the order they were made."""
        run_id = check_id(self.name, "run", run_id)
        p = self.placeholder
        sql = f"SELECT {_COLUMNS} FROM run_decisions WHERE run_id = {p} ORDER BY id"
        rows = await self._read(sql, (run_id,), f"reading run {label(run_id)}'s decisions")
        return [_decision(row) for row in rows]

    async def run_inputs(self, run_id: str) -> list[RecordedInput]:
        """A run's recorded inputs in the order they came."""
        run_id = check_id(self.name, "run", run_id)
        p = self.placeholder
        sql = f"SELECT {_INPUT_COLUMNS} FROM run_inputs WHERE run_id = {p} ORDER BY id"
        rows = await self._read(sql, (run_id,), f"reading run {label(run_id)}'s recorded inputs")
        return [
            RecordedInput(
                run_id=r[0],
                agent_id=r[1],
                thread_id=r[2],
                resource_id=r[3],
                kind=r[4],
                step=int(r[5]),
                body=r[6],
                at=iso_from_text(r[7]),
            )
            for r in rows
        ]

    def _between(
        self, since: str, until: str, agent_id: str | None, limit: int, offset: int
    ) -> tuple[str, tuple[Any, ...]]:
        """The WHERE clause (and its arguments, `limit` and `offset` last) of rows from `since` to
        before `until`, of one agent when given."""
        low, high = check_date(self.name, "since", since), check_date(self.name, "until", until)
        assert low is not None
        assert high is not None
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_PAGE)
        offset = check_count(self.name, "offset", offset, low=0, high=2**62)
        p = self.placeholder
        args: tuple[Any, ...] = (time_text(low), time_text(high))
        where = f"at >= {p} AND at < {p}"
        if agent_id is not None:
            where += f" AND agent_id = {p}"
            args += (check_id(self.name, "agent", agent_id),)
        return where, (*args, limit, offset)

    async def decisions_between(
        self, since: str, until: str, *, agent_id: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[Decision]:
        """Decisions made from `since` to before `until`, oldest first (of one agent when given)."""
        where, args = self._between(since, until, agent_id, limit, offset)
        p = self.placeholder
        sql = f"SELECT {_COLUMNS} FROM run_decisions WHERE {where} ORDER BY at, id LIMIT {p} OFFSET {p}"
        rows = await self._read(sql, args, "reading decisions by time")
        return [_decision(row) for row in rows]

    async def recorded_runs(
        self, since: str, until: str, *, agent_id: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[str]:
        """Runs whose input was recorded from `since` to before `until`, oldest first."""
        where, args = self._between(since, until, agent_id, limit, offset)
        p = self.placeholder
        sql = (
            f"SELECT run_id FROM run_inputs WHERE kind = 'input' AND {where} "
            f"ORDER BY at, id LIMIT {p} OFFSET {p}"
        )
        rows = await self._read(sql, args, "reading recorded runs by time")
        return [row[0] for row in rows]
