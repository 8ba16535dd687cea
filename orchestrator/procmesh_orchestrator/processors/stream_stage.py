"""One output processor's ProcessOutputStream session in the pipeline (`OutputPipeline`): a plain
session, of one processor or several of one sidecar fused, that is not speculative (a run of
speculative sessions is a `SpeculativeGroup`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from procmesh import tracing
from procmesh.hooks import quiet_effects
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorCallError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.stream_call import (
    ABORT,
    CHUNK,
    EFFECTS,
    END,
    ERROR,
    FLOWING,
    HOOK,
    SEVERITY,
    PartCounts,
    Pipe,
    answer_items,
    check_extras,
    count_session,
    encode_parts,
    fused_items,
    merged,
    partial_items,
    session_policy,
)
from procmesh_orchestrator.processors.stream_rpc import SessionClock, StreamCall
from procmesh_orchestrator.processors.wire import read_effects
from procmesh_orchestrator.run.hooks import StreamEffects

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller


class PlainStage:
    """One processor's ProcessOutputStream session: parts go out in batches, results come back in order.

    The feeder sends whatever is queued as one stream message; the reader
    applies each response's results in order and hands them on in bulk, so the
    next stage batches as well. Parts this processor must not see (data-*
    without process_data_parts, or everything once it failed open) and the
    effects of earlier stages pass through in their place.
    """

    def __init__(
        self,
        caller: GrpcHookCaller,
        members: Sequence[ProcessorHandle],
        inq: Pipe,
        outq: Pipe,
        *,
        announce_signals: bool,
        side: bool = False,
    ) -> None:
        self.caller = caller
        self.announce_signals = announce_signals
        self.handle = members[0]
        self.members = tuple(members)
        """The processors of the session: one, or several of one sidecar fused (`context.fused`)."""
        self.data_parts = any(m.process_data_parts for m in members)
        self.timeout = min(m.timeout for m in members)
        self.stream_timeout = min(m.stream_timeout for m in members)
        self.clock: SessionClock | None = None
        """The session's time limits (`_open` starts it)."""
        self.side = side
        """A parallel branch whose output is not picked: its effects apply, the part goes on as it came."""
        self.inq = inq
        self.outq = outq
        # (kind, value, awaits_result) in arrival order; the head leaves first.
        self.pending: deque[tuple[str, Any, bool]] = deque()
        self.call: StreamCall | None = None
        self.reader: asyncio.Task[None] | None = None
        self.span = tracing.Span()
        """The stream session's span (`_open` starts it, the reader ends it)."""
        self.failed_open = False
        self.broken: str | None = None
        """Why the stream failed, once it has (applied to the next part that needs an answer)."""
        self.input_refused = False
        """The sidecar answered INVALID_ARGUMENT: it could not read the input; no policy lets it by."""
        self.stream_done = False
        self.end_queued = False
        self.stopped = False
        self.seq = 0
        self.sent: deque[tuple[int, float]] = deque()
        """(seq, when it was queued) of each part awaiting its result; timeouts count from then."""
        self.parts = PartCounts(self.caller, self.handle)
        """Its parts in, out, dropped, rewritten and the latency it adds (a fused session's count
        under its first processor)."""
        self.worst = ""
        """A monitor entry: the most severe thing it would have done in this session (its span)."""
        self.quiet = quiet_effects(len(self.members))
        """A fused answer's effects when none of its processors did anything (`_apply_fused`)."""
        self.partial = len(self.members) == 1 and not self.handle.shadow and not side
        self.partials: list[ppb.StreamPartResult] = []  # the head part's, handed on as they came

    def _eligible(self, chunk: tpb.Chunk) -> bool:
        # a fused session gets data parts when one of its processors takes them (the sidecar
        # passes them by the others)
        return not self.failed_open and (self.data_parts or not chunk.type.startswith("data-"))

    def _flush_head(self) -> None:
        """Hand on every head item that needs no result (pass-throughs, effects, end and error markers)."""
        pending = self.pending
        while pending and not self.stopped:
            kind, value, awaits = pending[0]
            if awaits:
                if not self.failed_open:
                    return
                pending.popleft()
                self.outq.put_nowait((CHUNK, value))  # failed open: the part goes on unchanged
                continue
            if kind == END and self.call is not None and not self.stream_done:
                return  # the state arrives with the stream's end
            pending.popleft()
            self.outq.put_nowait((kind, value))
            if kind not in FLOWING:
                self.stopped = True

    async def feed(self) -> None:
        while not self.stopped:
            batch = await self.inq.get()
            head: ppb.ProcessOutputStreamRequest | None = None  # the session's first request's
            out: list[tuple[int, tpb.Chunk]] = []
            now = time.monotonic()
            finished = False
            for kind, value in batch:
                if kind == EFFECTS:  # an earlier stage's: it goes on in its place
                    self.pending.append((kind, value, False))
                    continue
                if kind != CHUNK:  # end, upstream abort or error: nothing follows it
                    self.pending.append((kind, value, False))
                    self.end_queued = finished = True
                    if kind == END and self.broken is not None:
                        self._apply_failure()  # the session broke while idle: its end never comes
                    break
                if self.broken is not None and self._eligible(value):
                    self._apply_failure()  # the stream died while idle: this part finds out
                    if self.stopped:
                        return
                if not self._eligible(value):
                    self.pending.append((CHUNK, value, False))
                    continue
                if self.call is None:
                    head = self._open()
                elif not out:
                    now = time.monotonic()  # the batch's parts are sent together: one clock read
                self.seq += 1
                out.append((self.seq, value))
                self.pending.append((CHUNK, value, True))
                self.sent.append((self.seq, now))
            self._flush_head()
            if out and not self.failed_open and self.call is not None:
                first, *more = encode_parts(out)  # several requests for a batch of large parts
                await self.call.write(first if head is None else head.SerializeToString() + first)
                for data in more:
                    await self.call.write(data)
            if finished:
                if self.call is not None and not self.failed_open and not self.stopped:
                    assert self.clock is not None
                    self.clock.close()  # the end is due from now, even if the half-close waits
                    await self.call.done_writing()
                return

    def _open(self) -> ppb.ProcessOutputStreamRequest:
        """Open the session; its first request's context (sent with the first batch's parts)."""
        pid = self.handle.processor_id
        # The session's span lives across the feeder and reader tasks: started, not made current.
        self.span = tracing.start(
            f"procmesh.hook {HOOK} {pid}",
            kind="client",
            attributes={"procmesh.processor.id": pid, "procmesh.hook": HOOK, "procmesh.outcome": "pass"},
        )
        self.clock = SessionClock(self.caller, self.timeout, self.stream_timeout)
        raw = self.handle.client.open_stream(
            self.clock.grpc_timeout(self.caller), metadata=self.span.metadata(), encoded=True
        )
        self.call = StreamCall(raw)
        self.reader = asyncio.create_task(self._read(self.call))
        first = ppb.ProcessOutputStreamRequest(partial_results=self.partial, unchanged_results=True)
        self.caller.fill_context(first.context, self.handle)
        if len(self.members) > 1:
            self.caller.fill_fused(first.context, self.members[1:])
            first.context.announce_signals = self.announce_signals
            self.span.set("procmesh.fused", [m.processor_id for m in self.members[1:]])
        return first

    def shutdown(self) -> list[asyncio.Task[None]]:
        """Cancel the session; the tasks to await."""
        if self.call is not None and not self.call.done():
            self.call.cancel()
        return [self.reader] if self.reader is not None else []

    def release(self) -> None:
        """Let go of the parts it holds, once its tasks are done (its reader task refers to it)."""
        self.pending.clear()
        self.sent.clear()
        self.partials.clear()

    def _awaiting(self) -> bool:
        return any(awaits for _, _, awaits in self.pending)

    async def _read(self, call: StreamCall) -> None:
        info, handle, clock = self.caller.info, self.handle, self.clock
        assert clock is not None
        # the oldest unanswered part's time limit counts from when it was sent
        clock.watch(call, lambda: self.sent[0][1] if self.sent else None)
        try:
            while True:
                resp = await clock.read()
                if resp is None:
                    if self._awaiting() or not self.end_queued:
                        raise MalformedResponseError("stream ended before every part was answered")
                    self._session_ended("monitor" if handle.shadow else "ok")
                    break
                self.parts.now = time.monotonic()
                for res in resp.results:
                    if res.unchanged_through:
                        self._apply_unchanged(res)
                    else:
                        self._apply(res)
                    if self.stopped:
                        return
                self.parts.flush()
                if resp.HasField("end"):
                    info.states[handle.processor_id] = resp.end.state
                    for member, state in zip(self.members[1:], resp.end.fused_states, strict=False):
                        info.states[member.processor_id] = state
                self._flush_head()
        except ProcessorCallError as exc:  # the gRPC status (translated by StreamCall) or a broken contract
            self.input_refused = exc.input_refused
            self._failed(str(exc))
        finally:
            clock.stop()
            self.stream_done = True
            self.parts.flush()
            self.span.end()
            self._flush_head()

    def _apply(self, res: ppb.StreamPartResult) -> None:
        """Apply one part's result; the parts before it that needed none go first."""
        if not self.sent:  # checked first: handing on an end that waits for the states would hide it
            raise MalformedResponseError("more results than parts sent")
        while self.pending and not self.pending[0][2]:
            self._flush_one()
        check_extras(res)
        if res.more:  # parts let go early: on at once, the part's answer is still to come
            self.partials.append(res)
            for item in partial_items(self.handle, res, self.sent[0][0], self.partial, self.announce_signals):
                self.outq.put_nowait(item)
            return
        _, original, _ = self.pending.popleft()
        seq, sent_at = self.sent.popleft()
        if res.seq != seq:
            raise MalformedResponseError(f"result for part {res.seq} where part {seq} was expected")
        self.parts.answered(original, merged(self.partials, res), sent_at)
        self.partials.clear()
        if len(self.members) > 1:
            self.parts.decided(original, self.parts.last)
            self._apply_fused(res)
            return
        if self.handle.shadow:  # record what it would do; the part goes on as it came
            self.parts.decided(original, "monitor", self._monitor(res))
            self.outq.put_nowait((CHUNK, original))
            return
        # a parallel branch whose output is not picked: its effects apply, the part goes on as it came
        items = answer_items(self.handle, res, announce_signals=self.announce_signals, parts=not self.side)
        for kind, value in items:
            if kind == ABORT:
                self.parts.decided(original, "retry" if value.retry else "abort")
                self.span.outcome("abort")
                self._session_ended("abort", value)
                self._stop(ABORT, value)
                return
            self.outq.put_nowait((kind, value))
        self.parts.decided(original, self.parts.last)
        if self.side:
            self.outq.put_nowait((CHUNK, original))

    def _apply_unchanged(self, res: ppb.StreamPartResult) -> None:
        """A result answering parts `seq` through `unchanged_through` as passed on unchanged: each
        part's result as the sidecar would have sent it (the part as sent; a fused session's
        empty outcomes), applied in order."""
        first, last = res.seq, res.unchanged_through
        if last < first or res.more or res.HasField("part") or res.HasField("effects") or res.extra_parts:
            raise MalformedResponseError(
                f"unchanged result for parts {first} to {last}: a range that ends before it starts, "
                "or carries a part, effects or more"
            )
        # Nothing to record, monitor or merge: each part goes on as it came, counted as passed
        # (what `_apply` would do with its result, without building one: P3 fused).
        direct = not self.handle.shadow and not self.partials and not self.parts.recording
        for seq in range(first, last + 1):
            if not self.sent or self.sent[0][0] != seq:  # checked before an end is handed on
                raise MalformedResponseError(
                    f"unchanged result for parts {first} to {last}; part {seq} not awaited"
                )
            while not self.pending[0][2]:
                self._flush_one()
            if direct:
                _, original, _ = self.pending.popleft()
                _, sent_at = self.sent.popleft()
                self.parts.passed(max(0.0, self.parts.now - sent_at), 1)
                self.outq.put_nowait((CHUNK, original))
                continue
            one = ppb.StreamPartResult(seq=seq, part=self.pending[0][1])
            if len(self.members) > 1:
                one.effects.CopyFrom(self.quiet)
            self._apply(one)
            if self.stopped:
                return

    def _monitor(self, res: ppb.StreamPartResult) -> str:
        """A monitor entry's answer: its violations are recorded, what it would do is counted and
        returned."""
        abort = None
        if res.HasField("effects"):
            effects = read_effects(
                self.handle.processor_id, HOOK, res.effects, decode_chunks=False, source=self.handle.source
            )
            if effects.violations:
                self.outq.put_nowait((EFFECTS, StreamEffects(violations=effects.violations)))
            abort = effects.abort
        would = self.parts.last
        if abort is not None:
            would = "retry" if abort.retry else "abort"
        self.caller.monitor_decision(self.handle, HOOK, would, abort)
        if SEVERITY.index(would) > SEVERITY.index(self.worst or "pass"):
            self.worst = would
            self.span.set("procmesh.monitor.would", would)
        return would

    def _session_ended(self, outcome: str, abort: Any = None) -> None:
        count_session(self.caller, self.members, outcome, abort)

    def _apply_fused(self, res: ppb.StreamPartResult) -> None:
        if res.effects == self.quiet and not res.extra_parts and res.HasField("part"):
            self.outq.put_nowait((CHUNK, res.part))  # `fused_items` of it, without a read per processor
            return
        for kind, value in fused_items(self.caller, self.members, res):
            if kind in (ABORT, ERROR):
                if kind == ABORT:
                    self.span.outcome("abort")
                    self._session_ended("abort", value)
                self._stop(kind, value)
                return
            self.outq.put_nowait((kind, value))

    def _stop(self, kind: str, value: Any) -> None:
        """End the stream here with an abort or an error; the session is cancelled."""
        self.outq.put_nowait((kind, value))
        self.stopped = True
        assert self.call is not None
        self.call.cancel()

    def _flush_one(self) -> None:
        kind, value, _ = self.pending.popleft()
        self.outq.put_nowait((kind, value))
        if kind not in FLOWING:
            self.stopped = True

    def _failed(self, cause: str) -> None:
        """The stream failed: the session is torn down at once; the failure policy applies now if
        parts (or the stream's end) await answers, else at the next part it would need."""
        self.span.outcome("failure")
        self.broken = cause
        if self.call is not None:
            self.call.cancel()  # a timed-out session stays in flight no longer
        if self._awaiting() or (self.pending and self.pending[0][0] == END):
            self._apply_failure()

    def _apply_failure(self) -> None:
        if self.stopped or self.failed_open:
            return
        assert self.call is not None
        self.call.cancel()
        cause = self.broken or "stream failed"
        error = session_policy(self.caller, self.members, cause, input_refused=self.input_refused)
        if error is not None:  # fail-closed: the error goes on in the part's place, and ends the stream
            self.outq.put_nowait((ERROR, error))
            self.stopped = True
            return
        self.failed_open = True
        self._flush_head()
