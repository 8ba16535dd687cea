"""Consecutive speculative output processors: every part goes to all of them at once.

Sequentially, processor j receives what processor j-1 handed on. Here processor j also receives
each part as it entered the group, *speculatively*, at the same time as the processors before it.
Results commit strictly in lane order: processor j's answer to a part it got speculatively stands
when what processor j-1 committed for that part is exactly that part (it passed it on unchanged).
Otherwise (j-1 rewrote, dropped or added to it) processor j is rewound (``rewind_to``: its answers
from that part on are withdrawn and its state goes back) and given the committed parts, followed
again by the later parts it had been given speculatively. An abort or a fail-closed failure ends
the group there; later answers are never applied. Each answer applies only when it commits, so
a withdrawn answer's effects (signals, chunks, violations, abort) never show: the output is the
sequential pipeline's. ``committed_through`` tells each processor, in batches, what it can forget.
A session ends at an abort (the SDKs' rule), so a processor whose abort on a part it got in
advance is withdrawn gets a new session, given again the parts it committed (`_Member.restart`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh import tracing
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorCallError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.stream_call import (
    ABORT,
    CHUNK,
    END,
    ERROR,
    FLOWING,
    HOOK,
    Item,
    Pipe,
    SessionClock,
    StreamCall,
    answer_items,
    fused_items,
    session_policy,
)

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller

COMMIT_BATCH = 64
"""Commits a processor is told about at once (``committed_through``), when nothing else goes out."""

_CLOSE = object()
"""The writer's sign to half-close the call."""
_MARK = "mark"
"""An inbox item: every committed item for its group input came before it."""


@dataclass
class _Fed:
    """A part a processor was given and has not committed: its seq, and what it stands for."""

    seq: int
    part: tpb.Chunk
    origin: int | None
    """The group input it was given speculatively in place of (None: committed input)."""
    sent_at: float


class _Member:
    """One speculative processor's session: what it was fed, its answers, its committed input."""

    def __init__(self, group: SpeculativeGroup, handles: Sequence[ProcessorHandle]) -> None:
        self.group = group
        self.handle = handles[0]
        self.handles = tuple(handles)
        """One processor, or several of one sidecar fused in this session (`context.fused`)."""
        self.data_parts = any(h.process_data_parts for h in handles)
        self.timeout = min(h.timeout for h in handles)
        self.stream_timeout = min(h.stream_timeout for h in handles)
        self.clock: SessionClock | None = None
        """Its session's time limits (`_open` starts one per session)."""
        self.fed: deque[_Fed] = deque()
        """Committed input first (`firm` of them), then the parts given in advance, by origin."""
        self.firm = 0
        self.unanswered: deque[tuple[int, float]] = deque()
        """(seq, sent at) of the parts sent and not answered, oldest first (answers come in order)."""
        self.answers: dict[int, ppb.StreamPartResult] = {}
        self.inbox: deque[tuple[str, Any, int]] = deque()
        """Its committed input, in order: (kind, value, the group input it came from)."""
        self.seq = 0
        self.committed = 0
        self.told = 0
        """The highest seq sent as ``committed_through``."""
        self.rewind = 0
        self.out: ppb.ProcessOutputStreamRequest | None = None
        """The request being built this round (sent by `flush`)."""
        self.call: StreamCall | None = None
        self.writes: asyncio.Queue[Any] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.span = tracing.Span()
        self.broken: str | None = None
        self.input_refused = False
        self.failed_open = False
        self.ended = False
        self.closing = False
        self.counts: dict[str, int] = {}
        """Parts given in advance, by outcome (committed, discarded)."""
        self.live: set[int] = set()
        """The seqs of `fed`: an answer for another one is a withdrawn part's."""
        self.replay: list[tpb.Chunk] = []
        """Every part it committed, in order: what a new session is given again (`restart`)."""
        self.skip: set[int] = set()
        """Seqs of parts given again in a new session: their answers are committed already."""
        self.lost = False
        """Its session ended at an abort that was then withdrawn: it needs a new one (`restart`)."""
        self.end_state: ppb.StreamEnd | None = None
        """Its stream's end, with the states (stored for the run when its end commits)."""

    def takes(self, chunk: tpb.Chunk) -> bool:
        return not self.failed_open and (self.data_parts or not chunk.type.startswith("data-"))

    def items(self, res: ppb.StreamPartResult, announce_signals: bool) -> list[Item]:
        """What its answer to a part hands on (`answer_items`, or `fused_items` for a fused one)."""
        if len(self.handles) > 1:
            return fused_items(self.group.caller, self.handles, res)
        return answer_items(self.handle.processor_id, res, announce_signals=announce_signals)

    # -- feeding --------------------------------------------------------------------------------

    def feed(self, part: tpb.Chunk, origin: int | None) -> None:
        """Give it `part` in this round's request."""
        if self.call is None:
            self._open()
        if self.out is None:
            self.out = ppb.ProcessOutputStreamRequest()
        self.seq += 1
        self.out.parts.add(seq=self.seq, part=part)
        now = time.monotonic()
        self.fed.append(_Fed(self.seq, part, origin, now))
        self.live.add(self.seq)
        self.unanswered.append((self.seq, now))
        if origin is None:
            self.firm += 1

    def withdraw(self, at: int) -> list[_Fed]:
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
        while self.unanswered and self.unanswered[-1][0] >= first:
            self.unanswered.pop()
        for entry in withdrawn:
            self.live.discard(entry.seq)
            answer = self.answers.pop(entry.seq, None)
            if answer is not None and _aborts(answer):
                self.lost = True  # the SDK ended the session at that abort
        self.group.count(self, "discarded", sum(1 for e in withdrawn if e.origin is not None))
        unsent = {p.seq for p in self.out.parts} if self.out is not None else set()
        if self.out is not None and unsent:
            keep = [p for p in self.out.parts if p.seq < first]
            del self.out.parts[:]
            self.out.parts.extend(keep)
        if first not in unsent:
            self.rewind = min(self.rewind, first) if self.rewind else first
        return withdrawn

    def flush(self) -> None:
        """Send this round's request: the rewind, the commit mark, the parts."""
        out = self.out
        self.out = None
        if self.call is None or self.failed_open or self.closing:
            return
        tell = self.committed > self.told and (out is not None or self.committed - self.told >= COMMIT_BATCH)
        if out is None and not self.rewind and not tell:
            return
        out = out or ppb.ProcessOutputStreamRequest()
        if self.rewind:
            out.rewind_to, self.rewind = self.rewind, 0
        if tell:
            out.committed_through = self.told = self.committed
        self.writes.put_nowait(out)

    def _open(self) -> None:
        pid = self.handle.processor_id
        self.span = tracing.start(
            f"procmesh.hook {HOOK} {pid}",
            kind="client",
            attributes={"procmesh.processor.id": pid, "procmesh.hook": HOOK, "procmesh.outcome": "pass"},
        )
        caller = self.group.caller
        self.clock = SessionClock(caller, self.timeout, self.stream_timeout)
        self.call = StreamCall(
            self.handle.client.open_stream(self.clock.grpc_timeout(caller), metadata=self.span.metadata())
        )
        self.out = ppb.ProcessOutputStreamRequest()
        caller.fill_context(self.out.context, self.handle)
        if len(self.handles) > 1:
            caller.fill_fused(self.out.context, self.handles[1:])
            self.out.context.announce_signals = self.group.announce_signals
            self.span.set("procmesh.fused", [h.processor_id for h in self.handles[1:]])
        self.tasks = [
            asyncio.create_task(self._write(self.call)),
            asyncio.create_task(self._read(self.call, self.clock)),
        ]

    async def _write(self, call: StreamCall) -> None:
        while True:
            request = await self.writes.get()
            if request is _CLOSE:
                await call.done_writing()
                return
            await call.write(request)

    def close(self) -> None:
        """Half-close: everything it will get has been sent."""
        if self.call is not None and not self.closing and not self.failed_open:
            self.flush()
            self.closing = True
            assert self.clock is not None
            self.clock.close()  # the end is due from now, even if the half-close waits
            self.writes.put_nowait(_CLOSE)

    # -- answers ---------------------------------------------------------------------------------

    def restart(self) -> None:
        """A new session in place of one that ended at a withdrawn abort: it is given again every
        part it committed (their answers are known, so skipped) and then what it holds now."""
        self.cancel()
        self.span.end()
        self.call, self.tasks, self.writes = None, [], asyncio.Queue()
        self.lost = self.ended = False
        self.rewind = self.told = 0
        self.answers.clear()
        self.unanswered.clear()
        self.out = None
        held = list(self.fed)
        self.fed.clear()
        self.live.clear()
        self.firm = 0
        self._open()
        assert self.out is not None
        for part in self.replay:
            self.seq += 1
            self.out.parts.add(seq=self.seq).part.CopyFrom(part)
            self.skip.add(self.seq)
        self.committed = self.seq
        for entry in held:
            self.feed(entry.part, entry.origin)

    async def _read(self, call: StreamCall, clock: SessionClock) -> None:
        read: asyncio.Future[ppb.ProcessOutputStreamResponse | None] | None = None
        try:
            while True:
                if read is None:
                    read = asyncio.ensure_future(call.read())
                # the oldest unanswered part's time limit counts from when it was sent
                wait = clock.wait(self.unanswered[0][1] if self.unanswered else None)
                done, _ = await asyncio.wait({read}, timeout=wait)
                if not done:
                    continue
                resp, read = read.result(), None
                if call is not self.call:
                    return  # a session given up for a new one (`restart`)
                if resp is None:
                    if not self.closing and not self.ended:
                        raise MalformedResponseError("stream ended before every part was answered")
                    break
                for res in resp.results:
                    if res.seq > self.seq:
                        raise MalformedResponseError(f"result for part {res.seq}, never sent")
                    while self.unanswered and self.unanswered[0][0] <= res.seq:
                        self.unanswered.popleft()
                    if res.seq in self.skip:
                        self.skip.discard(res.seq)
                    elif res.seq in self.live:
                        self.answers[res.seq] = res
                    elif _aborts(res):
                        self.lost = True  # a withdrawn part's abort ended the session
                if resp.HasField("end"):
                    self.end_state = resp.end
                    self.ended = True
                self.group.advance()
        except ProcessorCallError as exc:  # the gRPC status (translated by StreamCall) or a broken contract
            if call is self.call:
                self.span.outcome("failure")
                self.input_refused = exc.input_refused
                self.broken = str(exc)
                call.cancel()  # torn down at once: a timed-out session stays in flight no longer
                self.group.advance()
        finally:
            if read is not None:
                read.cancel()
            if call is self.call:
                self.ended = True
                self.span.end()

    def cancel(self) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()
        for task in self.tasks:
            task.cancel()


def _aborts(res: ppb.StreamPartResult) -> bool:
    """Whether the answer aborts (a fused session's: any of its processors)."""
    if not res.HasField("effects"):
        return False
    return res.effects.HasField("abort") or any(o.effects.HasField("abort") for o in res.effects.fused)


def kind_ends(kind: str) -> bool:
    """An abort or an error: the stream ends there (an end marker ends it by running out)."""
    return kind in (ABORT, ERROR)


class SpeculativeGroup:
    """A run of speculative output sessions (one processor each, or several of one sidecar
    fused), fed at once (module doc)."""

    def __init__(
        self,
        caller: GrpcHookCaller,
        sessions: Sequence[Sequence[ProcessorHandle]],
        inq: Pipe,
        outq: Pipe,
        *,
        announce_signals: bool,
    ) -> None:
        self.caller = caller
        self.announce_signals = announce_signals
        self.members = [_Member(self, session) for session in sessions]
        self.inq = inq
        self.outq = outq
        self.taken = 0
        """Group inputs so far: each one's index is its origin."""
        self.done = False
        """The group handed on its last item (an end, an abort or an error)."""
        self.cut_at: int | None = None
        """The member that handed on an abort or an error: nothing is fed any more, and the
        members up to it stop (what they would commit can never apply)."""

    def count(self, member: _Member, outcome: str, n: int = 1) -> None:
        """Count parts given in advance (the metric is updated once, at `shutdown`)."""
        member.counts[outcome] = member.counts.get(outcome, 0) + n

    async def feed(self) -> None:
        """Take the upstream items, feed them, commit what can be (the readers commit the rest)."""
        last = False
        while not last and self.cut_at is None:
            batch = await self.inq.get()
            for kind, value in batch:
                self._take(kind, value)
                if kind not in FLOWING:  # an end, an abort or an error: nothing follows it
                    last = True
                    break
            self.advance()

    def _take(self, kind: str, value: Any) -> None:
        origin = self.taken
        self.taken += 1
        self.members[0].inbox.append((kind, value, origin))
        if kind != CHUNK:
            return
        self.members[0].inbox.append((_MARK, None, origin))
        for j, member in enumerate(self.members):
            if member.takes(value):
                member.feed(value, None if j == 0 else origin)

    def advance(self) -> None:
        """Commit, member by member in lane order, every answer that can commit now; then send."""
        progress = True
        while progress and not self.done:
            progress = False
            for j in range(len(self.members)):
                if self.cut_at is not None and j <= self.cut_at:
                    continue
                while self._step(j):
                    progress = True
                if self.done:
                    break
        for member in self.members:
            if member.lost and not self.done:
                member.restart()
            member.flush()

    def _step(self, j: int) -> bool:
        """Commit the head of member j's committed input, if it can be; whether it did."""
        member = self.members[j]
        if not member.inbox:
            return False
        kind, value, origin = member.inbox[0]
        if kind == END:
            if member.call is not None and not member.failed_open:
                if member.broken is not None:
                    return self._failure(j)  # its end (the states) never came
                if not member.ended:
                    member.close()
                    return False  # its state comes with its stream's end
                self._store_states(member)
            member.inbox.popleft()
            self._hand_on(j, [(kind, value)], origin)
            return True
        if kind != CHUNK or not member.takes(value):  # effects, marks, parts it does not take
            member.inbox.popleft()
            self._hand_on(j, [(kind, value)], origin)
            return True
        head = member.fed[0]  # a committed part it takes was fed to it as committed (_reconcile)
        assert head.origin is None, "a committed part is fed as committed"
        answer = member.answers.pop(head.seq, None)
        if answer is None:
            if member.broken is None:
                return False
            return self._failure(j)
        member.inbox.popleft()
        member.fed.popleft()
        member.live.discard(head.seq)
        member.replay.append(head.part)
        member.firm -= 1
        member.committed = head.seq
        try:
            items = member.items(answer, self.announce_signals)
        except MalformedResponseError as exc:
            member.broken = str(exc)
            member.inbox.appendleft((kind, value, origin))
            return self._failure(j)
        if items and items[-1][0] == ABORT:
            member.span.outcome("abort")
        self._hand_on(j, items, origin)
        return True

    def _store_states(self, member: _Member) -> None:
        """Its stream's end committed: the states it carries are the run's now."""
        end = member.end_state
        if end is None:
            return
        states = self.caller.info.states
        states[member.handle.processor_id] = end.state
        for handle, state in zip(member.handles[1:], end.fused_states, strict=False):
            states[handle.processor_id] = state

    def _failure(self, j: int) -> bool:
        """Member j broke where an answer was needed: its failure policy."""
        member = self.members[j]
        member.cancel()
        cause = member.broken or "stream failed"
        error = session_policy(self.caller, member.handles, cause, input_refused=member.input_refused)
        if error is not None:  # fail-closed: the error goes on in the part's place and ends the stream
            member.inbox.clear()
            self._hand_on(j, [(ERROR, error)], self.taken)
            return True
        member.failed_open = True  # from here on its input passes by unchanged
        member.fed.clear()
        member.firm = 0
        member.answers.clear()
        return True

    def _hand_on(self, j: int, items: list[Item], origin: int) -> None:
        """What member j committed for group input `origin`: to the next member, or downstream."""
        if items and kind_ends(items[-1][0]):
            self.cut_at = j if self.cut_at is None else min(self.cut_at, j)
            self.members[j].inbox.clear()
        if j + 1 == len(self.members):
            for item in items:
                if item[0] == _MARK:
                    continue
                self.outq.put_nowait(item)
                if item[0] in (END, ABORT, ERROR):
                    self.done = True
            return
        following = self.members[j + 1]
        for kind, value in items:
            if kind == _MARK or (kind == CHUNK and following.takes(value)):
                self._reconcile(following, origin, value if kind == CHUNK else None)
            following.inbox.append((kind, value, origin))

    def _reconcile(self, member: _Member, origin: int, part: tpb.Chunk | None) -> None:
        """Make what `member` was fed agree with its committed input, one committed part (or the
        mark that group input `origin` is done) at a time, in order.

        The first committed part of an origin that equals what the member was given for it in
        advance confirms that guess (its answer stands). Any other committed part goes in before
        the guesses for later origins, which are withdrawn and given again after it; an origin
        done without confirming its guess withdraws the guess (and the later ones, given again).
        """
        if member.failed_open or self.cut_at is not None:
            return
        fed = member.fed
        # the guesses of earlier origins are all settled (each origin's mark came before this)
        at = member.firm
        guess = fed[at] if at < len(fed) and fed[at].origin == origin else None
        if guess is not None and part is not None and part == guess.part:
            guess.origin = None
            member.firm += 1
            self.count(member, "committed")
            return
        if guess is None and part is None:
            return  # the origin is done and nothing was guessed for it
        withdrawn = member.withdraw(at)
        if part is not None:
            member.feed(part, None)
        for entry in withdrawn:
            if entry.origin is not None and entry.origin > origin:
                member.feed(entry.part, entry.origin)  # again, still speculative

    def shutdown(self) -> list[asyncio.Task[None]]:
        """Cancel every session; the tasks to await. Answers not committed are discarded."""
        tasks: list[asyncio.Task[None]] = []
        for member in self.members:
            self.count(member, "discarded", sum(1 for e in member.fed if e.origin is not None))
            member.fed.clear()
            member.cancel()
            tasks += member.tasks
            for outcome, n in member.counts.items():
                if n:
                    labels = (member.handle.processor_id, HOOK, outcome)
                    self.caller.metrics.speculative_calls.labels(*labels).inc(n)
        return tasks
