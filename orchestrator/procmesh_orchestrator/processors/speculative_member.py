"""One member of a speculative group (`speculative_stream`): a processor's session (one
processor, or several of one sidecar fused), what it was fed and its answers, its time limits.

The group decides what is committed, withdrawn and handed on; a member keeps the books of its
own session: the parts it was given (committed first, then those given in advance), the
answers that came back, the requests going out (parts, ``rewind_to``, ``committed_through``),
and a new session in place of one that ended at a withdrawn abort (`Member.restart`). A round's
parts are encoded by the group (`SpeculativeGroup.encoded`): members given the same parts (the
common case: every one gets each part at once) share one encoding, written as bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh import tracing
from procmesh.hooks import quiet_effects
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorCallError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.stream_call import (
    END,
    HOOK,
    Item,
    PartCounts,
    Pipe,
    answer_items,
    check_extras,
    count_session,
    fused_items,
)
from procmesh_orchestrator.processors.stream_rpc import SessionClock, StreamCall

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup

COMMIT_BATCH = 64
"""Commits a processor is told about at once (``committed_through``) when nothing else goes out:
only once every part sent to it is committed (while parts are in flight or uncommitted it holds
their records anyway, and the next request with parts carries the mark), and never just before
its half-close (which ends the session). A mark alone costs a write, the sidecar's empty answer
and its read: in a 1,000-delta run through 3 members, 12 of the run's 24 writes."""

UNCHANGED = ppb.StreamPartResult()
"""The answer to a part in a run a sidecar answered as unchanged (``unchanged_through``): the part
itself, passed on, and nothing else. One shared object, never changed, told by identity
(`SpeculativeGroup._passes` commits it at once; `Member.answer` makes it a result for the rest)."""

MARK = "mark"
"""An inbox item: every committed item for its group input came before it."""

_WRITE = "write"
"""A request for the writer (the serialized bytes); an `END` item half-closes the call."""


@dataclass(slots=True)
class Fed:
    """A part a processor was given and has not committed: its seq, and what it stands for."""

    seq: int
    part: tpb.Chunk
    origin: int | None
    """The group input it was given speculatively in place of (None: committed input)."""
    sent_at: float


class Member:
    """One speculative processor's session: what it was fed, its answers, its committed input."""

    def __init__(self, group: SpeculativeGroup, handles: Sequence[ProcessorHandle], index: int) -> None:
        self.group = group
        self.index = index
        """Its place in the group's lane order."""
        self.handle = handles[0]
        self.handles = tuple(handles)
        """One processor, or several of one sidecar fused in this session (`context.fused`)."""
        self.data_parts = any(h.process_data_parts for h in handles)
        self.timeout = min(h.timeout for h in handles)
        self.stream_timeout = min(h.stream_timeout for h in handles)
        self.clock: SessionClock | None = None
        """Its session's time limits (`open` starts one per session)."""
        self.fed: deque[Fed] = deque()
        """Committed input first (`firm` of them), then the parts given in advance, by origin."""
        self.firm = 0
        self.again: deque[Fed] = deque()
        """Guesses withdrawn in this round, to be given again at its end (`SpeculativeGroup._give_again`)."""
        self.answered = 0
        """The highest seq answered (answers come in order): the parts in `fed` after it are the
        unanswered ones, the time limit counting from the oldest one's send (`_waiting_since`)."""
        self.answers: dict[int, ppb.StreamPartResult] = {}
        self.inbox: deque[tuple[str, Any, int]] = deque()
        """Its committed input, in order: (kind, value, the group input it came from)."""
        self.seq = 0
        self.committed = 0
        self.told = 0
        """The highest seq sent as ``committed_through``."""
        self.rewind = 0
        self.out: list[tuple[int, tpb.Chunk]] | None = None
        """The parts (seq, part) of the request being built this round (sent by `flush`)."""
        self.head: ppb.ProcessOutputStreamRequest | None = None
        """The session's first request's context (sent with its first round's parts)."""
        self.call: StreamCall | None = None
        self.writes = Pipe()
        """Its requests for the writer task, taken all at once (an `asyncio.Queue` would cost four
        deques and an Event, about 2.5 KB, per session)."""
        self.tasks: list[asyncio.Task[None]] = []
        self.span = tracing.Span()
        self.broken: str | None = None
        self.input_refused = False
        self.failed_open = False
        self.ended = False
        self.closing = False
        self.counted = False
        """Its session's "ok" counted (at its `end` answer, or at the end of its stream)."""
        self.counts: dict[str, int] = {}
        """Parts given in advance, by outcome (committed, discarded)."""
        self.dead: set[int] = set()
        """Seqs withdrawn after they were sent and before their answer came: that answer is a
        withdrawn part's (every other answer is for a part in `fed`; a set per member rather than
        one of the seqs in `fed`, which would hold an entry per part in flight)."""
        self.replay: list[tpb.Chunk] = []
        """Every part it committed, in order: what a new session is given again (`restart`)."""
        self.skip: set[int] = set()
        """Seqs of parts given again in a new session: their answers are committed already."""
        self.lost = False
        """Its session ended at an abort that was then withdrawn: it needs a new one (`restart`)."""
        self.end_state: ppb.StreamEnd | None = None
        """Its stream's end, with the states (stored for the run when its end commits)."""
        self.parts = PartCounts(group.caller, self.handle)
        """Its committed parts' metrics (a fused session's under its first processor)."""
        self.arrived: dict[int, float] = {}
        """When each answer in `answers` came (the latency it added counts to then)."""
        self.partials: dict[int, list[ppb.StreamPartResult]] = {}
        """Partial results (``more``) per seq, in order, until the part's answer commits."""
        self.handed: dict[int, int] = {}
        """How many of a seq's partial results were handed on already (`SpeculativeGroup._early`)."""
        self.early: deque[tuple[int, tpb.Chunk]] = deque()
        """Parts handed on from partial results of guesses not yet confirmed (with their seq), in
        order; seq 0: their guess was withdrawn, so its answers given again must start with them."""
        self.dropped: deque[tpb.Chunk] = deque()
        """Committed parts it dropped (held) and has not let go since, in order."""
        self.quiet = quiet_effects(len(self.handles))
        """The effects of an answer in which none of its processors did anything: empty, and for a
        fused session one empty outcome per further processor (the SDKs send them even when
        empty), so a fused pass-through answer commits as a plain one (`SpeculativeGroup._passes`)."""

    def answer(self, seq: int, part: tpb.Chunk) -> ppb.StreamPartResult | None:
        """Its answer to part `seq` (`part`), taken from `answers`: `UNCHANGED` made the result it
        stands for (the part, and a fused session's empty outcomes); None while it has none."""
        answer = self.answers.pop(seq, None)
        if answer is UNCHANGED:
            answer = ppb.StreamPartResult(seq=seq, part=part)
            if len(self.handles) > 1:
                answer.effects.CopyFrom(self.quiet)
        return answer

    def takes(self, chunk: tpb.Chunk) -> bool:
        return not self.failed_open and (self.data_parts or not chunk.type.startswith("data-"))

    def items(self, res: ppb.StreamPartResult, announce_signals: bool) -> list[Item]:
        """What its answer to a part hands on (`answer_items`, or `fused_items` for a fused one)."""
        if len(self.handles) > 1:
            return fused_items(self.group.caller, self.handles, res)
        return answer_items(self.handle, res, announce_signals=announce_signals)

    # -- feeding --------------------------------------------------------------------------------

    def feed(self, part: tpb.Chunk, origin: int | None) -> None:
        """Give it `part` in this round's request: committed input (`origin` None) or in advance."""
        self.feed_all([(part, origin)], origin is None)

    def feed_all(self, parts: Sequence[tuple[tpb.Chunk, int | None]], firm: bool) -> None:
        """Give it `parts` (each with its group input) in this round's request, as committed
        input (`firm`) or in advance."""
        if not parts:
            return
        if self.call is None:
            self.open()
        out = self.out
        if out is None:
            out = self.out = []
        seq, now, fed = self.seq, self.group.now, self.fed
        for part, origin in parts:
            seq += 1
            out.append((seq, part))
            fed.append(Fed(seq, part, None if firm else origin, now))
        self.seq = seq
        if firm:
            self.firm += len(parts)

    def open_guess(self, origin: int) -> Fed | None:
        """The oldest guess still open, if given for group input `origin` or an earlier one (a
        part the processor before holds may come with a later input)."""
        at = self.firm
        if at < len(self.fed):
            entry = self.fed[at]
            if entry.origin is not None and entry.origin <= origin:
                return entry
        return None

    def withdraw(self, at: int) -> list[Fed]:
        """Withdraw its answers from fed position `at` on; the withdrawn entries.

        Parts still in this round's request are simply not sent; parts already sent are
        withdrawn with ``rewind_to`` (the request always holds the newest seqs, so either the
        first withdrawn part was sent or none was).
        """
        withdrawn = [self.fed.pop() for _ in range(len(self.fed) - at)][::-1]
        if not withdrawn:
            return []
        first = withdrawn[0].seq
        self.firm -= sum(1 for e in withdrawn if e.origin is None)
        unsent = {seq for seq, _ in self.out} if self.out is not None else set()
        for entry in withdrawn:
            self.partials.pop(entry.seq, None)
            if self.handed.pop(entry.seq, 0):
                self._orphan(entry.seq)
            answer = self.answers.pop(entry.seq, None)
            self.arrived.pop(entry.seq, None)
            if answer is not None and aborts(answer):
                self.lost = True  # the SDK ended the session at that abort
            elif entry.seq > self.answered and entry.seq not in unsent:
                self.dead.add(entry.seq)  # sent, its answer still to come
        self.group.count(self, "discarded", sum(1 for e in withdrawn if e.origin is not None))
        if self.out is not None and unsent:
            self.out = [(seq, part) for seq, part in self.out if seq < first]
        if first not in unsent:
            self.rewind = min(self.rewind, first) if self.rewind else first
        return withdrawn

    def _orphan(self, since: int = 0) -> None:
        """The guesses from seq `since` on whose parts were handed on early are withdrawn: those
        parts must come first again in what it commits (`SpeculativeGroup._unahead`)."""
        self.early = deque((0 if seq >= since else seq, part) for seq, part in self.early)

    def forget_partials(self) -> None:
        """It failed open: what its partial results kept is no longer needed."""
        self.partials.clear()
        self.handed.clear()
        self.early.clear()
        self.dropped.clear()

    def flush(self, closing: bool = False) -> None:
        """Send this round's request: the rewind, the commit mark, the parts (a mark alone only
        as `COMMIT_BATCH` says)."""
        out, head = self.out, self.head
        self.out = self.head = None
        if self.call is None or self.failed_open or self.closing:
            return
        untold = self.committed - self.told
        tell = untold > 0 and (
            out is not None or (untold >= COMMIT_BATCH and not closing and self.committed >= self.seq)
        )
        if out is None and not self.rewind and not tell:
            return
        # fields concatenated are one message: the context, the shared parts, this member's marks
        # (a batch of large parts goes in several requests, the marks with the first: a request's
        # rewind and commit apply before its parts)
        first, *more = self.group.encoded(out) if out else [b""]
        if head is not None:
            first = head.SerializeToString() + first
        if self.rewind or tell:
            marks = ppb.ProcessOutputStreamRequest()
            if self.rewind:
                marks.rewind_to, self.rewind = self.rewind, 0
            if tell:
                marks.committed_through = self.told = self.committed
            first += marks.SerializeToString()
        self.writes.put_nowait((_WRITE, first))
        for data in more:
            self.writes.put_nowait((_WRITE, data))

    def open(self) -> None:
        """Open its session (on its first parts): the call, its time limits, its writer and reader."""
        pid = self.handle.processor_id
        self.span = tracing.start(
            f"procmesh.hook {HOOK} {pid}",
            kind="client",
            attributes={"procmesh.processor.id": pid, "procmesh.hook": HOOK, "procmesh.outcome": "pass"},
        )
        caller = self.group.caller
        self.clock = SessionClock(caller, self.timeout, self.stream_timeout)
        self.call = StreamCall(
            self.handle.client.open_stream(
                self.clock.grpc_timeout(caller), metadata=self.span.metadata(), encoded=True
            )
        )
        self.out = []
        self.head = ppb.ProcessOutputStreamRequest(
            partial_results=len(self.handles) == 1, unchanged_results=True
        )
        caller.fill_context(self.head.context, self.handle)
        if len(self.handles) > 1:
            caller.fill_fused(self.head.context, self.handles[1:])
            self.head.context.announce_signals = self.group.announce_signals
            self.span.set("procmesh.fused", [h.processor_id for h in self.handles[1:]])
        self.tasks = [
            asyncio.create_task(self._write(self.call)),
            asyncio.create_task(self._read(self.call, self.clock)),
        ]

    async def _write(self, call: StreamCall) -> None:
        while True:
            requests = await self.writes.get()
            for kind, request in requests:
                if kind == END:
                    await call.done_writing()
                    return
                await call.write(request)
            del requests, request  # not kept while the next ones are awaited (the first is large)

    def close(self) -> None:
        """Half-close: everything it will get has been sent."""
        if self.call is not None and not self.closing and not self.failed_open:
            self.flush(closing=True)
            self.closing = True
            assert self.clock is not None
            self.clock.close()  # the end is due from now, even if the half-close waits
            self.writes.put_nowait((END, None))

    # -- answers ---------------------------------------------------------------------------------

    def restart(self) -> None:
        """A new session in place of one that ended at a withdrawn abort: it is given again every
        part it committed (their answers are known, so skipped) and then what it holds now."""
        self.cancel()
        self.span.end()
        self.call, self.tasks, self.writes = None, [], Pipe()
        self.lost = self.ended = self.counted = False
        self.rewind = self.told = 0
        self.answers.clear()
        self.arrived.clear()
        self.partials.clear()
        if self.handed:
            self.handed.clear()
            self._orphan()
        self.dead.clear()  # the old session's: it is read no more
        self.out = self.head = None
        held = list(self.fed)
        self.fed.clear()
        self.firm = 0
        self.open()
        assert self.out is not None
        for part in self.replay:
            self.seq += 1
            self.out.append((self.seq, part))
            self.skip.add(self.seq)
        self.committed = self.seq
        for entry in held:
            self.feed(entry.part, entry.origin)

    async def _read(self, call: StreamCall, clock: SessionClock) -> None:
        # the oldest unanswered part's time limit counts from when it was sent
        clock.watch(call, self._waiting_since)
        try:
            while True:
                resp = await clock.read()
                if call is not self.call:
                    return  # a session given up for a new one (`restart`)
                if resp is None:
                    if not self.closing and not self.ended:
                        raise MalformedResponseError("stream ended before every part was answered")
                    self._count_ok()
                    break
                now = time.monotonic()
                sent, skip, dead, answers = self.seq, self.skip, self.dead, self.answers
                arrived = self.arrived
                top = 0
                lane = self.group.lane
                for res in resp.results:
                    seq = res.seq
                    if lane is not None:  # the group's lane books (`speculative_lane`)
                        last = lane.answer(self.index, self, res, now)
                        if last:
                            top = max(top, last)
                            continue
                        self.group.unfold()
                        lane = None
                    if res.unchanged_through:
                        top = self._unchanged(res, top, now)
                        continue
                    if seq > sent:
                        raise MalformedResponseError(f"result for part {seq}, never sent")
                    check_extras(res)
                    if res.more:  # parts let go early: the part's answer is still to come
                        if len(self.handles) > 1 or res.effects.HasField("abort"):
                            raise MalformedResponseError(f"partial result for part {seq} not allowed")
                        if seq not in skip and seq not in dead:
                            self.partials.setdefault(seq, []).append(res)
                        continue
                    if seq > top:
                        top = seq
                    if skip and seq in skip:
                        skip.discard(seq)
                    elif dead and seq in dead:
                        dead.discard(seq)
                        if aborts(res):
                            self.lost = True  # a withdrawn part's abort ended the session
                    else:
                        answers[seq] = res
                        arrived[seq] = now
                self.answered = max(self.answered, top)  # and every part before it
                if dead:  # a withdrawn part not answered by now never will be
                    dead.difference_update([seq for seq in dead if seq <= top])
                if resp.HasField("end"):
                    self.end_state = resp.end
                    self.ended = True
                    # counted now: once the stage has its END the run may end and cancel this
                    # reader before the stream's own end arrives, and the session would go uncounted
                    self._count_ok()
                self.group.advance()
        except ProcessorCallError as exc:  # the gRPC status (translated by StreamCall) or a broken contract
            if call is self.call:
                self.span.outcome("failure")
                self.input_refused = exc.input_refused
                self.broken = str(exc)
                call.cancel()  # torn down at once: a timed-out session stays in flight no longer
                self.group.advance()
        except Exception as exc:  # the group's own bug (in `advance`): end the stream, never hang it
            self.group.fault(exc)
        finally:
            clock.stop()
            if call is self.call:
                self.ended = True
                self.span.end()

    def _unchanged(self, res: ppb.StreamPartResult, top: int, now: float) -> int:
        """A result answering parts `seq` through `unchanged_through` as passed on unchanged: each
        one's answer is `UNCHANGED` (parts given again in a new session, or withdrawn, as `_read`
        treats theirs); the highest seq answered now."""
        first, last = res.seq, res.unchanged_through
        if last > self.seq or last < first:
            raise MalformedResponseError(
                f"unchanged result for parts {first} to {last}; the last part sent is {self.seq}"
            )
        if res.more or res.HasField("part") or res.HasField("effects") or res.extra_parts:
            raise MalformedResponseError(
                f"unchanged result for parts {first} to {last} carries a part, effects or more"
            )
        answers, arrived, skip, dead = self.answers, self.arrived, self.skip, self.dead
        for seq in range(first, last + 1):
            if skip and seq in skip:
                skip.discard(seq)
            elif dead and seq in dead:
                dead.discard(seq)
            else:
                answers[seq] = UNCHANGED
                arrived[seq] = now
        return max(top, last)

    def _count_ok(self) -> None:
        if self.closing and not self.counted:  # its end after everything was sent (not a cut)
            self.counted = True
            count_session(self.group.caller, self.handles, "ok")

    def _waiting_since(self) -> float | None:
        """When the oldest unanswered part was sent (None: every part sent was answered)."""
        if self.group.lane is not None:
            return self.group.lane.waiting_since(self.index)
        answered = self.answered
        for entry in self.fed:  # in seq order, the answered ones first
            if entry.seq > answered:
                return entry.sent_at
        return None

    def cancel(self) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()
        for task in self.tasks:
            task.cancel()

    def release(self) -> None:
        """Let go of the parts it holds, once its tasks are done (`SpeculativeGroup.release`)."""
        self.replay.clear()
        self.fed.clear()
        self.again.clear()
        self.answers.clear()
        self.arrived.clear()
        self.inbox.clear()
        self.partials.clear()
        self.early.clear()
        self.dropped.clear()
        self.out = self.head = None
        self.tasks.clear()


def aborts(res: ppb.StreamPartResult) -> bool:
    """Whether the answer aborts (a fused session's: any of its processors)."""
    if not res.HasField("effects"):
        return False
    return res.effects.HasField("abort") or any(o.effects.HasField("abort") for o in res.effects.fused)
