"""What a speculative processor's stream keeps to undo parts the orchestrator may still withdraw.

One record per batch (stream message): the state, the number of parts seen and the failure of
every processor of the stream before the batch, and the batch's parts. A rewind to seq ``r``
puts back the record of the first batch that reaches ``r`` and replays that batch's parts before
``r`` without answering them: exact because a speculative processor's results depend only on
its input and state (the contract it declares). One deep copy per batch, not per part, is the
whole cost when nothing is withdrawn; ``committed_through`` lets records go.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from procmesh.errors import InvalidInputError


class Undoable(Protocol):
    """One processor of a stream session, as far as a rewind touches it."""

    kwargs: dict[str, Any]
    stream_parts: list[Any]
    error: str


@dataclass
class _Record:
    states: list[Any]
    seen: list[int]
    errors: list[str]
    parts: Sequence[Any]
    """The batch's StreamPart messages, in order (their ``seq`` rises)."""


class History:
    """The records of a speculative stream's uncommitted batches, oldest first."""

    def __init__(self, stages: Sequence[Undoable]) -> None:
        self._stages = stages
        self._records: list[_Record] = []
        self._committed = 0

    def keep(self, parts: Sequence[Any]) -> None:
        """Record the stages as they are before `parts` (the next batch) go through them.

        `parts` is kept as given (the request's repeated field): the request outlives the batch.
        """
        if not parts:
            return
        stages = self._stages
        self._records.append(
            _Record(
                states=[_copy(s.kwargs["state"]) for s in stages],
                seen=[len(s.stream_parts) for s in stages],
                errors=[s.error for s in stages],
                parts=parts,
            )
        )

    def commit(self, through: int) -> None:
        """Forget the batches no rewind can reach any more (every part's seq <= `through`)."""
        self._committed = max(self._committed, through)
        while self._records and self._records[0].parts[-1].seq <= through:
            self._records.pop(0)

    async def rewind(self, to: int, replay: Callable[[list[Any]], Awaitable[object]]) -> None:
        """Withdraw the parts from seq `to` on: put the stages back and `replay` the parts before it."""
        if to <= self._committed:
            raise InvalidInputError(
                f"rewind_to {to} is at or below committed_through {self._committed}: those parts are final"
            )
        at = next((i for i, r in enumerate(self._records) if r.parts[-1].seq >= to), None)
        if at is None:
            return  # no part from `to` on was received: nothing to withdraw
        record = self._records[at]
        del self._records[at:]
        undo = zip(self._stages, record.states, record.seen, record.errors, strict=True)
        for stage, state, seen, error in undo:
            stage.kwargs["state"] = _copy(state)  # the record stays as it was, for a later rewind
            del stage.stream_parts[seen:]
            stage.error = error
        kept = [part for part in record.parts if part.seq < to]
        if kept:  # they stay undoable, from the same "before" as the batch they came in
            self._records.append(_Record(record.states, record.seen, record.errors, kept))
            await replay(kept)


def _copy(value: Any) -> Any:
    """A deep copy of a JSON-like state (dicts, lists, scalars): several times cheaper than
    `copy.deepcopy`, whose memo and dispatch cost a pass-through processor's empty state per batch.
    Anything else (a processor may keep any object in its state) goes to `copy.deepcopy`."""
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()} if value else {}
    if type(value) is list:
        return [_copy(v) for v in value]
    if value is None or type(value) in _ATOMS:
        return value
    return copy.deepcopy(value)


_ATOMS = frozenset({str, int, float, bool})
