"""What every output-stream session shares: the item kinds, the pipes between stages, the counts,
a result's items (the gRPC call itself, its errors and time limits: `stream_rpc`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.wire import read_effects
from procmesh_orchestrator.run.hooks import StreamEffects, Violation
from procmesh_orchestrator.run.messages import signal_data, signal_record

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller

HOOK = "process_output_stream"

END = "end"
CHUNK = "chunk"
EFFECTS = "effects"
ABORT = "abort"
ERROR = "error"
FLOWING = (CHUNK, EFFECTS)
"""Kinds a stage hands on and keeps going; any other ends the stream (end, abort, error)."""
MAX_BATCH = 256

MAX_REQUEST_BYTES = 1 << 20
"""A stream request's size past which its parts go in several requests (`encode_parts`): far under
the largest message gRPC takes by default (4 MiB in most implementations; 16 MiB in procmesh's
SDKs), so a batch of large parts (a model's files, big data parts, long deltas) is never a request
a sidecar refuses. A part larger than this goes in a request of its own."""

Item = tuple[str, Any]


def encode_parts(parts: list[tuple[int, tpb.Chunk]]) -> list[bytes]:
    """The parts (seq, part) as the ``parts`` of serialized ``ProcessOutputStreamRequest``s, in
    order: one request's, or several of at most `MAX_REQUEST_BYTES` each when they are larger
    together (halved until they fit: only batches of large parts pay the second encoding)."""
    request = ppb.ProcessOutputStreamRequest()
    add = request.parts.add
    for seq, part in parts:
        add(seq=seq, part=part)
    data = request.SerializeToString()
    if len(data) <= MAX_REQUEST_BYTES or len(parts) == 1:
        return [data]
    half = len(parts) // 2
    return encode_parts(parts[:half]) + encode_parts(parts[half:])


class Pipe:
    """The items from one stage to the next, handed over in bulk: the taker, woken by the first
    item put, takes at its next turn everything put by then (one wake-up per batch, not per
    part; at most `MAX_BATCH` at once). A put wakes the taker directly: no queue between the
    two, so an item waits one turn of the event loop, not two. `len` is what waits for the next
    stage; `taken` (shared by a pipeline's pipes) is set at each take, so the pipeline's source
    can wait for room (`OutputPipeline.run`)."""

    def __init__(self, taken: asyncio.Event | None = None) -> None:
        self._items: list[Item] = []
        self._waiter: asyncio.Future[None] | None = None
        self._taken = taken

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: Item) -> None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def put_all(self, items: list[Item]) -> None:
        """`put_nowait` for several items, in order: one wake-up check."""
        self._items += items
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> list[Item]:
        """Everything handed over so far (at least one item, at most `MAX_BATCH`), in order."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items = self._items
        if len(items) > MAX_BATCH:
            items, self._items = items[:MAX_BATCH], items[MAX_BATCH:]
        else:
            self._items = []
        if self._taken is not None:
            self._taken.set()
        return items


SEVERITY = ("pass", "rewrite", "drop", "retry", "abort")
"""What a monitor entry would do, least severe first (its session's span keeps the worst)."""


def observe_many(histogram: Any, amount: float, n: int) -> None:
    """`histogram.observe(amount)` n times, in one update of its sum and of one bucket (a
    prometheus_client Histogram child observes one value at a time; its buckets are kept apart
    and added up at collection, the first bound at or above the value takes it)."""
    if n == 1:
        histogram.observe(amount)
        return
    histogram._sum.inc(amount * n)
    histogram._buckets[bisect.bisect_left(histogram._upper_bounds, amount)].inc(n)


class PartCounts:
    """One stream session's part metrics (procmesh_stream_parts_total and
    procmesh_stream_part_added_seconds), its labelled children looked up once; the counts and
    the latencies are added up per part and handed to the metrics at each `flush` (once per
    response read): the parts of a batch sent together and answered together added the same
    latency, which is observed once for all of them (`observe_many`)."""

    def __init__(self, caller: GrpcHookCaller, handle: ProcessorHandle) -> None:
        metrics = caller.metrics
        labels = caller.series(handle)
        self._counters = [
            metrics.stream_parts.labels(*labels, o) for o in ("in", "out", "dropped", "rewritten")
        ]
        self._counts = [0, 0, 0, 0]
        self._latency = metrics.stream_part_latency.labels(*labels)
        self.now = 0.0
        """When the response being applied arrived (`time.monotonic`)."""
        self.last = "pass"
        """What the last answer did to its part: pass, rewrite or drop."""
        self._record = caller.decisions
        self._labels, self._step = labels, caller.info.step_number
        self.offset = -1
        """The last answered part's offset in the session (the decision record's ``part``)."""
        self._took = 0.0
        self._same = 0
        """Answers in a row (not yet observed) that added `_took`."""

    def answered(self, original: tpb.Chunk, res: ppb.StreamPartResult, sent_at: float) -> None:
        """Count an answer to `original` (sent at `sent_at`) as the run applies it."""
        counts = self._counts
        counts[0] += 1
        self.offset += 1
        took = max(0.0, self.now - sent_at)
        if took != self._took:
            self._observe()
            self._took = took
        self._same += 1
        n = len(res.extra_parts) + (1 if res.HasField("part") else 0)
        if n == 0:
            counts[2] += 1
            self.last = "drop"
            return
        counts[1] += n
        if n > 1 or res.part != original:
            counts[3] += 1
            self.last = "rewrite"
        else:
            self.last = "pass"

    def passed(self, took: float, n: int) -> None:
        """Count `n` answers that passed their part on unchanged, each having added `took`
        (`answered` for a run of pass-throughs, which the run keeps no record of)."""
        counts = self._counts
        counts[0] += n
        counts[1] += n
        self.offset += n
        if took != self._took:
            self._observe()
            self._took = took
        self._same += n
        self.last = "pass"

    @property
    def recording(self) -> bool:
        """Whether each answer's decision goes on the run's record (`decided`)."""
        return self._record is not None

    def decided(self, original: tpb.Chunk, outcome: str, would: str = "") -> None:
        """Put the last answered part's decision on the run's record (when it keeps one)."""
        if self._record is not None:
            seen, took = self._record.part_seen(original), self._took
            self._record.add(
                self._labels, HOOK, self._step, outcome, took=took, seen=seen, would=would, part=self.offset
            )

    def _observe(self) -> None:
        if self._same:
            observe_many(self._latency, self._took, self._same)
            self._same = 0

    def flush(self) -> None:
        """Hand the counts and the latencies so far to the metrics."""
        self._observe()
        for counter, n in zip(self._counters, self._counts, strict=True):
            if n:
                counter.inc(n)
        self._counts = [0, 0, 0, 0]


def count_session(
    caller: GrpcHookCaller, members: Sequence[ProcessorHandle], outcome: str, abort: Any = None
) -> None:
    """Count a session that ended as one call of each of its processors (ok, monitor, or abort
    for the one whose abort ended it); a failed one is counted by its failure policy, and one
    this side cut (the run ended elsewhere) not at all."""
    for member in members:
        own = outcome
        if abort is not None and member.processor_id != abort.processor_id:
            own = "ok"
        caller.metrics.processor_call(caller.series(member), HOOK, own)


def answer_items(
    handle: ProcessorHandle, res: ppb.StreamPartResult, *, announce_signals: bool, parts: bool = True
) -> list[Item]:
    """What one processor's result for a part hands on, in order: its effects, the data-signal
    chunks announcing its signals, its custom chunks, then its part(s) (unless not `parts`), or
    its abort last."""
    if not res.HasField("effects"):  # the common case, a part passed or replaced: no lists to build
        if not parts or not res.HasField("part"):
            return []
        if not res.extra_parts:
            return [(CHUNK, res.part)]
    items: list[Item] = []
    if res.HasField("effects"):
        effects = read_effects(
            handle.processor_id, HOOK, res.effects, decode_chunks=False, source=handle.source
        )
        records = [signal_record(signal) for signal in effects.signals]
        if records or effects.violations:
            items.append((EFFECTS, StreamEffects(records, effects.violations)))
        if announce_signals:
            for record in records:
                chunk = {"type": "data-signal", "data": signal_data(record), "transient": True}
                items.append((CHUNK, convert.chunk_to_proto(chunk)))
        # validated by read_effects; protobuf stays protobuf
        items += [(CHUNK, custom) for custom in res.effects.custom_chunks]
        if effects.abort is not None:
            items.append((ABORT, effects.abort))
            return items
    if parts:
        if res.HasField("part"):
            items.append((CHUNK, res.part))
        items += [(CHUNK, extra) for extra in res.extra_parts]
    return items


def partial_items(
    handle: ProcessorHandle, res: ppb.StreamPartResult, seq: int, accepted: bool, announce_signals: bool
) -> list[Item]:
    """What a partial result (``more``) for part `seq` hands on at once: its effects, then its
    parts (`answer_items`). Malformed for another part, on a stream that did not take partial
    results, or with an abort (an abort comes in a part's last result)."""
    if res.seq != seq:
        raise MalformedResponseError(f"result for part {res.seq} where part {seq} was expected")
    if not accepted:
        raise MalformedResponseError(f"partial result for part {res.seq} on a stream that takes none")
    if res.effects.HasField("abort"):
        raise MalformedResponseError(f"partial result for part {res.seq} carries an abort")
    return answer_items(handle, res, announce_signals=announce_signals)


def check_extras(res: ppb.StreamPartResult) -> None:
    """`MalformedResponseError` for a result with ``extra_parts`` and no ``part``: the chunks after
    a dropped part have nothing to follow (proto/README.md), and reading them as emitted or as
    dropped, silently, would each be a guess."""
    if res.extra_parts and not res.HasField("part"):
        raise MalformedResponseError(
            f"result for part {res.seq} has {len(res.extra_parts)} extra_parts but no part: "
            "put the first chunk in part, or leave extra_parts empty to drop the part"
        )


def merged(partials: Sequence[ppb.StreamPartResult], res: ppb.StreamPartResult) -> ppb.StreamPartResult:
    """A part's answer given in several results (its partial ones, then `res`) as one result's
    parts, as the metrics and the decision record count it."""
    if not partials:
        return res
    chunks = [c for r in (*partials, res) if r.HasField("part") for c in (r.part, *r.extra_parts)]
    out = ppb.StreamPartResult(seq=res.seq)
    if chunks:
        out.part.CopyFrom(chunks[0])
        out.extra_parts.extend(chunks[1:])
    return out


def fused_items(
    caller: GrpcHookCaller, members: Sequence[ProcessorHandle], res: ppb.StreamPartResult
) -> list[Item]:
    """A fused session's result: every processor's signals and violations, then the part as the
    last processor left it (the chunks they emitted are in it already, in the pipeline's order,
    as the sidecar ran them), then the abort; a processor's failure (its outcome's `error`, once)
    goes through its own policy: fail-closed, its error ends the items there."""
    outcomes = [(members[0], res.effects, "")]
    outcomes += [(m, o.effects, o.error) for m, o in zip(members[1:], res.effects.fused, strict=False)]
    records: list[dict[str, Any]] = []
    violations: list[Violation] = []
    abort = None
    for handle, effects_pb, error in outcomes:
        if error:  # the sidecar passes its later parts by
            failure = caller.policy(handle, HOOK, error)
            if failure is not None:
                return [(ERROR, failure)]
            continue
        effects = read_effects(
            handle.processor_id, HOOK, effects_pb, decode_chunks=False, source=handle.source
        )
        records += [signal_record(signal) for signal in effects.signals]
        violations += effects.violations
        abort = effects.abort or abort  # the one that ends the stream is the last one's
    items: list[Item] = []
    if records or violations:
        items.append((EFFECTS, StreamEffects(records, violations)))
    if res.HasField("part"):
        items.append((CHUNK, res.part))
    items += [(CHUNK, extra) for extra in res.extra_parts]
    if abort is not None:
        items.append((ABORT, abort))
    return items


def session_policy(
    caller: GrpcHookCaller, members: Sequence[ProcessorHandle], cause: str, *, input_refused: bool
) -> Exception | None:
    """A session that failed as a whole fails for each of its processors: each one's policy,
    the first error wins (the orchestrator cannot tell which fused processor was slow)."""
    errors = [caller.policy(m, HOOK, cause, input_refused=input_refused) for m in members]
    return next((e for e in errors if e is not None), None)
