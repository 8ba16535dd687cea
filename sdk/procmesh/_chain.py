"""A fused ProcessOutputStream: each part through every processor of the stream, in order.

The orchestrator's pipeline hands a part from stage to stage; here the sidecar does it, with the
same per-processor rules (proto/README.md, "Fused processors"): ``data-*`` chunks only reach a
processor with ``process_data_parts``; what a processor emits goes on to the later ones in the
orchestrator's order (the data-signal chunks announcing its signals when ``announce_signals``
is set, then its custom chunks, then what it returned); an abort stops that processor (the
chunks before it still go through the later ones, and a later processor's abort on them is the
one that counts, as in the pipeline); a further processor that fails passes every later part
through unchanged, its outcome's ``error`` set once.

A batch goes through one processor at a time, not one part at a time: each processor still
sees its parts in stream order with its own state, so every answer is the same, and the trip to
a processor's hook loop is paid once per batch.

`Results` and `pristine` are how a stream, fused or not, answers a run of parts its processors
gave back unchanged with one result (``unchanged_through``) when the orchestrator takes it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from procmesh import convert
from procmesh._encode import fill_effects, quiet_effects
from procmesh._guard import clip
from procmesh._hookloop import relay
from procmesh._processor import HookEffects
from procmesh.errors import InternalError, ProcmeshError
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from procmesh._stream import Stage

Chunk = dict[str, Any]

_DEFAULT_TAGS = {
    "reactive": "system-reminder",
    "system-reminder": "system-reminder",
    "user-message": "user",
    "user": "user",
    "notification": "notification",
    "state": "state",
}
_CANONICAL_TYPES = {"system-reminder": "reactive", "user-message": "user"}


def announced(signal: dict[str, Any]) -> Chunk:
    """The transient data-signal chunk the orchestrator announces a signal with (its exact shape).

    The signal gets its message id here when it has none, so the chunk and the signal message the
    orchestrator adds from the effects agree.
    """
    signal.setdefault("id", str(uuid.uuid4()))
    kind = signal.get("type", "reactive")
    data: Chunk = {
        "id": signal["id"],
        "type": _CANONICAL_TYPES.get(kind, kind),
        "tagName": signal.get("tagName") or _DEFAULT_TAGS.get(kind, kind),
        "createdAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    if signal.get("attributes"):
        data["attributes"] = dict(signal["attributes"])
    if signal.get("transient", False):
        data["transient"] = True
    data["contents"] = signal.get("contents", "")
    return {"type": "data-signal", "data": data, "transient": True}


def returned_chunks(result: Any, hook: str) -> list[Chunk]:
    """A stream hook's return value as chunks: a chunk, a list of them, or None (dropped)."""
    if result is None:
        return []
    chunks = result if isinstance(result, list) else [result]
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
            raise InternalError(
                f"{hook} returned {type(chunk).__name__}; expected a chunk dict, a list of them, or None"
            )
    return chunks


def pristine(chunk: Chunk, part: tpb.Chunk) -> Chunk | None:
    """A copy of `chunk`, just converted from `part`, to tell afterwards whether the hooks gave it
    back unchanged (equal to it, so encoding it again would give `part`), or None: only a text
    delta's (what a stream is mostly made of: two small dicts to copy), whose conversion back is
    exactly `part` when it is not marked transient; any other answer is encoded as usual."""
    if part.transient or not part.HasField("text_delta"):
        return None
    return {"type": chunk["type"], "payload": dict(chunk["payload"])}


class Results:
    """A batch's results, in order. On a stream that takes them (``unchanged_results``), the
    parts passed on unchanged in a row are one result (``unchanged_through``); otherwise each
    is a result holding its part."""

    __slots__ = ("_items", "_run", "unchanged")

    def __init__(self, unchanged: bool) -> None:
        self.unchanged = unchanged
        self._items: list[ppb.StreamPartResult] = []
        self._run: ppb.StreamPartResult | None = None
        """The last result, while it is a run of unchanged parts that the next one may extend."""

    def append(self, res: ppb.StreamPartResult) -> None:
        self._items.append(res)
        self._run = None

    def passed(self, seq: int, part: tpb.Chunk) -> None:
        """Part `seq` (`part`) goes on as it came, with no effects."""
        run = self._run
        if not self.unchanged:
            res = ppb.StreamPartResult(seq=seq)
            res.part.CopyFrom(part)
            self.append(res)
        elif run is not None and run.unchanged_through + 1 == seq:
            run.unchanged_through = seq
        else:
            self._run = ppb.StreamPartResult(seq=seq, unchanged_through=seq)
            self._items.append(self._run)

    def take(self) -> list[ppb.StreamPartResult]:
        """The results so far (to send); the next ones start afresh."""
        items, self._items, self._run = self._items, [], None
        return items


@dataclass
class _Part:
    """One part of the batch on its way through the processors."""

    seq: int
    part: tpb.Chunk
    flow: list[Chunk]
    before: Chunk | None
    """`pristine`'s copy of the part as it came (when the stream takes unchanged results)."""
    did: list[HookEffects] = field(default_factory=list)
    """What each processor reached so far did to it (all its calls on the part's chunks)."""
    errors: list[str] = field(default_factory=list)
    """Each processor's failure on this part ("" when it did not fail here)."""


async def through_all(
    stages: Sequence[Stage],
    items: Sequence[ppb.StreamPart],
    call: Callable[[Stage, Chunk, HookEffects, bool], Awaitable[Any]],
    *,
    hook: str,
    announce: bool,
    quiet: bool,
    unchanged: bool,
) -> tuple[list[ppb.StreamPartResult], bool]:
    """The batch's results (up to the part whose abort ends the stream) and whether one aborted;
    with `unchanged`, a run of parts every processor gave back as they came is one result."""
    parts = []
    for item in items:
        chunk = convert.chunk_from_proto(item.part)
        before = pristine(chunk, item.part) if unchanged else None
        parts.append(_Part(item.seq, item.part, [chunk], before))
    aborts: dict[int, int] = {}  # stage -> the part it aborted on

    async def one_stage(index: int) -> None:  # on the stage's hook loop
        nonlocal parts
        stage = stages[index]
        try:
            for at, part in enumerate(parts):
                did = HookEffects(stage.hosted.id)
                part.did.append(did)
                part.errors.append("")
                out: list[Chunk] = []
                for position, chunk in enumerate(part.flow):
                    if not stage.takes(chunk["type"]):
                        out.append(chunk)
                        continue
                    effects = HookEffects(stage.hosted.id)
                    try:
                        chunks = returned_chunks(await call(stage, chunk, effects, quiet), hook)
                    except ProcmeshError as exc:
                        if index == 0:
                            raise  # the first processor's failure fails the stream, as its own would
                        stage.error = part.errors[index] = f"{exc.code.name}: {clip(str(exc))}"
                        out.extend(part.flow[position:])  # failed open: from here on, unchanged
                        break
                    if not effects.quiet():  # (most parts: their chunks alone go on)
                        did.signals += effects.signals
                        did.custom_chunks += effects.custom_chunks
                        did.violations += effects.violations
                        if announce:
                            out += [announced(signal) for signal in effects.signals]
                        out += effects.custom_chunks
                        if effects.abort is not None:
                            did.abort = effects.abort
                            break
                    out += chunks
                part.flow = out
                if did.abort is not None:
                    aborts[index] = at
                    break
            if aborts:
                parts = parts[: min(aborts.values()) + 1]  # the parts after an abort are never answered
        finally:
            stage.tally.end()  # the batch's latency observation, on the loop that counted it

    # Each processor's loop hands the batch on to the next one's directly (`relay`).
    await relay([(stage.hosted.loop, partial(one_stage, i)) for i, stage in enumerate(stages)])
    if aborts:
        # The abort that ends the stream is the last processor's that aborted on the last part
        # kept: an earlier processor's abort on that part came behind chunks a later one aborted on.
        last = len(parts) - 1
        final = max(i for i, at in aborts.items() if at == last)
        for i, at in aborts.items():
            if i != final and at == last:
                parts[last].did[i].abort = None
    results = Results(unchanged)
    for part in parts:
        if part.before is not None and _untouched(part):
            results.passed(part.seq, part.part)
        else:
            results.append(_result(part, stages))
    return results.take(), bool(aborts)


def _untouched(part: _Part) -> bool:
    """Every processor gave the part back as it came and did nothing else."""
    return len(part.flow) == 1 and part.flow[0] == part.before and _did_nothing(part)


def _did_nothing(part: _Part) -> bool:
    """No processor failed on the part or did anything but hand chunks on (what `fill_effects`
    writes for each would be empty)."""
    return not any(part.errors) and all(d.quiet() for d in part.did)


def _result(part: _Part, stages: Sequence[Stage]) -> ppb.StreamPartResult:
    res = ppb.StreamPartResult(seq=part.seq)
    for i, chunk in enumerate(part.flow):
        try:
            convert.chunk_to_proto(chunk, res.part if i == 0 else res.extra_parts.add())
        except (ValueError, TypeError) as exc:
            ids = [s.hosted.id for s in stages]
            detail = f"a processor of the fused stream {ids} left a malformed chunk: {exc}"
            raise InternalError(detail) from exc
    if _did_nothing(part):  # what `fill_effects` writes for each, in one copy
        res.effects.CopyFrom(quiet_effects(len(part.did)))
        return res
    fill_effects(res.effects, part.did[0], None)
    for did, error in zip(part.did[1:], part.errors[1:], strict=True):
        outcome = res.effects.fused.add(error=error)
        outcome.effects.SetInParent()  # present even when empty, as a unary outcome's
        fill_effects(outcome.effects, did, None)
    return res
