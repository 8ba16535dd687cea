"""Consecutive speculative output processors: every part goes to all of them at once.

Sequentially, processor j receives what processor j-1 handed on. Here processor j also receives
each part as it entered the group, *speculatively*, at the same time as the processors before it.
Results commit strictly in lane order: processor j's answer to a part it got speculatively stands
when what processor j-1 committed for that part is exactly that part (it passed it on unchanged),
then or with a later part (it held the part, a guard waiting for its window's verdict, and let it
go unchanged). Otherwise (j-1 rewrote, dropped or added to it) processor j is rewound
(``rewind_to``: its answers from that part on are withdrawn and its state goes back) and given
the committed parts, followed again by the later parts it had been given speculatively. An abort
or a fail-closed failure ends the group there; later answers are never applied. Each answer
applies only when it commits, so a withdrawn answer's effects (signals, chunks, violations,
abort) never show: the output is the sequential pipeline's. ``committed_through`` tells each
processor, in batches, what it can forget. The common case, a run of answers that pass their
parts on unchanged, commits at once (`SpeculativeGroup._passes`): one check per part, the part
handed on as the object the next processor was given in advance, so its guess is confirmed by
identity. A session ends at an abort (the SDKs' rule), so a processor whose abort on a part it got in
advance is withdrawn gets a new session, given again the parts it committed (`Member.restart`).
Each member's session, its books and its time limits are in `speculative_member`.

Partial results (``more``: parts a processor lets go while it still processes a part) are handed
on as soon as they can be, some before their guess is confirmed (`speculative_partial`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.speculative_lane import Lane
from procmesh_orchestrator.processors.speculative_member import MARK, UNCHANGED, Member
from procmesh_orchestrator.processors.speculative_partial import ahead, early, held, unahead
from procmesh_orchestrator.processors.stream_call import (
    ABORT,
    CHUNK,
    END,
    ERROR,
    FLOWING,
    HOOK,
    Item,
    Pipe,
    count_session,
    encode_parts,
    merged,
    session_policy,
)

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller


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
        self.members = [Member(self, session, j) for j, session in enumerate(sessions)]
        self.inq = inq
        self.outq = outq
        self.taken = 0
        """Group inputs so far: each one's index is its origin."""
        self.done = False
        """The group handed on its last item (an end, an abort or an error)."""
        self.cut_at: int | None = None
        """The member that handed on an abort or an error: nothing is fed any more, and the
        members up to it stop (what they would commit can never apply)."""
        self.now = time.monotonic()
        """When this round (a batch taken, or an answer read) began: the send time of the parts
        fed in it (they go out together), one clock read per round."""
        self.lane: Lane | None = Lane(self.members) if Lane.fits(self.members) else None
        """Its books while every member passes every part (`speculative_lane`); None once unfolded."""
        self._encodings: list[tuple[list[tuple[int, tpb.Chunk]], list[bytes]]] = []
        """This round's encoded parts (`encoded`), forgotten when its requests are sent."""

    def count(self, member: Member, outcome: str, n: int = 1) -> None:
        """Count parts given in advance (the metric is updated once, at `shutdown`)."""
        member.counts[outcome] = member.counts.get(outcome, 0) + n

    async def feed(self) -> None:
        """Take the upstream items, feed them, commit what can be (the readers commit the rest)."""
        last = False
        while not last and self.cut_at is None:
            batch = await self.inq.get()
            self.now = time.monotonic()
            last = self._take(batch)
            self.advance()

    def _take(self, batch: list[Item]) -> bool:
        """Put upstream items in the first member's committed input, each part followed by its
        mark, and give every member the parts it takes, a member's all at once (`Member.feed_all`:
        the first's as committed, the others' in advance); whether the stream ended there (an
        end, an abort or an error: nothing follows it)."""
        if self.lane is not None:
            return self.lane.take(self, batch)
        inbox = self.members[0].inbox
        origin = self.taken
        parts: list[tuple[tpb.Chunk, int]] = []
        data = False
        last = False
        for kind, value in batch:
            inbox.append((kind, value, origin))
            if kind == CHUNK:
                inbox.append((MARK, None, origin))
                parts.append((value, origin))
                data = data or value.type.startswith("data-")
            origin += 1
            if kind not in FLOWING:
                last = True
                break
        self.taken = origin
        if parts:
            plain = [(p, o) for p, o in parts if not p.type.startswith("data-")] if data else parts
            for j, member in enumerate(self.members):
                if not member.failed_open:  # `Member.takes`
                    member.feed_all(parts if member.data_parts else plain, j == 0)
        return last

    def advance(self) -> None:
        """Commit, member by member in lane order, every answer that can commit now; then send."""
        self.now = time.monotonic()
        if self.lane is not None:
            if self.lane.advance(self):
                self._encodings.clear()
                return
            self.unfold()
        progress = True
        while progress and not self.done:
            progress = False
            for j in range(len(self.members)):
                if self.cut_at is not None and j <= self.cut_at:
                    continue
                while self._passes(j) or self._step(j) or ahead(self, j):
                    progress = True
                if self.done:
                    break
        for member in self.members:
            self._give_again(member)
            if member.lost and not self.done:
                member.restart()
            member.flush()
            member.parts.flush()
        self._encodings.clear()

    def unfold(self) -> None:
        """Go on with the general books: the lane's written out (`Lane.unfold`), then what it
        held taken as any batch is."""
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.unfold(self)
            if lane.held:
                self._take(lane.held)

    def encoded(self, parts: list[tuple[int, tpb.Chunk]]) -> list[bytes]:
        """The parts (seq, part) as serialized requests' ``parts`` (`encode_parts`: one request,
        or several when large), encoded once per round for every member given the same ones (same
        seqs, same parts: each member writes the bytes)."""
        for same, data in self._encodings:
            # one list on a lane (`Lane`); tuples compare the part by identity first: no protobuf compare
            if same is parts or same == parts:
                return data
        data = encode_parts(parts)
        self._encodings.append((parts, data))
        return data

    def _step(self, j: int) -> bool:
        """Commit the head of member j's committed input, if it can be; whether it did."""
        member = self.members[j]
        if not member.inbox:
            return False
        kind, value, origin = member.inbox[0]
        if kind == END:
            if member.early and not member.failed_open:  # parts let go early were never let go again
                member.broken = member.broken or "parts let go early were withdrawn and not let go again"
                return self._failure(j)
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
        answer = member.answer(head.seq, head.part)
        if answer is None:
            if member.broken is None:
                return early(self, j, head.seq, origin)
            return self._failure(j)
        member.inbox.popleft()
        member.fed.popleft()
        partials = member.partials.pop(head.seq, [])
        handed = member.handed.pop(head.seq, 0)
        while member.early and member.early[0][0] == head.seq:
            member.early.popleft()  # handed on before their guess was confirmed: it is now
        member.parts.now = member.arrived.pop(head.seq, head.sent_at)
        member.parts.answered(head.part, merged(partials, answer), head.sent_at)
        member.replay.append(head.part)
        member.firm -= 1
        member.committed = head.seq
        try:
            items = [i for p in partials[handed:] for i in member.items(p, self.announce_signals)]
            items += member.items(answer, self.announce_signals)
            items = unahead(member, items)
        except MalformedResponseError as exc:
            member.broken = str(exc)
            member.inbox.appendleft((kind, value, origin))
            return self._failure(j)
        held(member, head.part, items)
        if items and items[-1][0] == ABORT:
            member.parts.decided(head.part, "retry" if items[-1][1].retry else "abort")
            member.span.outcome("abort")
            count_session(self.caller, member.handles, "abort", items[-1][1])
        else:
            member.parts.decided(head.part, member.parts.last)
        self._hand_on(j, items, origin)
        return True

    def _passes(self, j: int) -> bool:
        """Commit at once the run of plain pass-through answers (each part handed on as it came,
        nothing else) at the head of member j's committed input, with the marks between them;
        whether it committed any. This is `_step`, `_hand_on` and the next member's `_reconcile`
        for the common case, in one loop: each part is compared with its answer once, and handed
        on as the very object the next member was given in advance, so confirming that guess is
        an identity check. A fused session's answer whose processors all passed (its effects
        `Member.quiet`: an empty outcome each) is such an answer too. Anything else (effects, a
        rewrite, a drop, a part it does not take, an answer still to come, an end) stops the run
        and is `_step`'s."""
        member = self.members[j]
        inbox, fed, answers, arrived = member.inbox, member.fed, member.answers, member.arrived
        parts, quiet = member.parts, member.quiet
        if not inbox or member.failed_open or parts.recording or member.partials or member.early:
            return False
        following = self.members[j + 1] if j + 1 < len(self.members) else None
        # after a cut too: what it commits comes before the abort, and the next one answers it
        guessing = following is not None and not following.failed_open
        ahead = following.fed if following is not None else fed
        moved = confirmed = passed = 0
        took, same = -1.0, 0
        seq = member.committed
        out: list[Item] = []  # the last member's: handed downstream at once
        while inbox:
            kind, value, origin = inbox[0]
            if kind == MARK:
                inbox.popleft()
                moved += 1
                if following is not None:
                    at = following.firm
                    if guessing and at < len(ahead) and ahead[at].origin == origin:
                        self._reconcile(following, origin, None)  # its guess was not confirmed
                    elif following.again:
                        _settled(following, origin)
                    following.inbox.append((kind, value, origin))
                continue
            if kind != CHUNK or not fed:
                break
            head = fed[0]
            # a part it was fed is one it takes (the committed head is what it was fed, or equal)
            if head.part is not value and not member.data_parts and value.type.startswith("data-"):
                break
            answer = answers.get(head.seq)
            if answer is not UNCHANGED and (
                answer is None
                or answer.extra_parts
                or (answer.HasField("effects") and answer.effects != quiet)
                or not answer.HasField("part")
                or answer.part != head.part
            ):
                break
            inbox.popleft()
            fed.popleft()
            seq, part = head.seq, head.part
            del answers[seq]
            now = arrived.pop(seq, head.sent_at) - head.sent_at
            if now != took:
                if same:
                    parts.passed(max(0.0, took), same)
                took, same = now, 0
            same += 1
            member.replay.append(part)
            passed += 1
            if following is None:
                out.append((CHUNK, part))
                continue
            if guessing:
                at = following.firm  # `Member.open_guess`, inline
                guess = ahead[at] if at < len(ahead) else None
                if guess is not None and (guess.origin is None or guess.origin > origin):
                    guess = None
                if guess is not None and guess.part is part:
                    taken = True  # given this very part in advance: a part it takes
                else:
                    taken = following.data_parts or not part.type.startswith("data-")
                if taken:
                    if guess is not None and (guess.part is part or guess.part == part):
                        guess.origin = None
                        following.firm += 1
                        confirmed += 1
                    else:
                        self._reconcile(following, origin, part)
            following.inbox.append((CHUNK, part, origin))
        if same:
            parts.passed(max(0.0, took), same)
        if following is not None and confirmed:
            self.count(following, "committed", confirmed)
        if out:
            self.outq.put_all(out)
        member.committed = seq
        member.firm -= passed
        return bool(moved or passed)

    def fault(self, exc: Exception) -> None:
        """A fault of the group's own (a bug, not a sidecar's answer) in a member's reader: the
        stream ends with it as its error, as a stage's own bug does (`OutputPipeline.run`), where
        the reader's death would leave the run waiting for commits that never come."""
        if not self.done:
            self.done = True
            self.cut_at = len(self.members) - 1  # nothing is fed or committed any more
            self.outq.put_nowait((ERROR, exc))

    def _store_states(self, member: Member) -> None:
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
        member.forget_partials()
        member.fed.clear()
        member.firm = 0
        member.answers.clear()
        member.arrived.clear()
        return True

    def _hand_on(self, j: int, items: list[Item], origin: int) -> None:
        """What member j committed for group input `origin`: to the next member, or downstream."""
        if items and kind_ends(items[-1][0]):
            self.cut_at = j if self.cut_at is None else min(self.cut_at, j)
            self.members[j].inbox.clear()
        if j + 1 == len(self.members):
            for item in items:
                if item[0] == MARK:
                    continue
                self.outq.put_nowait(item)
                if item[0] in (END, ABORT, ERROR):
                    self.done = True
            return
        following = self.members[j + 1]
        for kind, value in items:
            if kind == MARK or (kind == CHUNK and following.takes(value)):
                self._reconcile(following, origin, value if kind == CHUNK else None)
            elif kind == END:
                self._close_guesses(following)
            following.inbox.append((kind, value, origin))

    def _close_guesses(self, member: Member) -> None:
        """The stream ends: the guesses still open were never let go; they are withdrawn, so the
        state its session ends with is that of its committed input alone."""
        if not member.failed_open and self.cut_at is None:
            member.withdraw(member.firm)

    def _reconcile(self, member: Member, origin: int, part: tpb.Chunk | None) -> None:
        """Make what `member` was fed agree with its committed input, one committed part (or the
        mark that group input `origin` is done) at a time, in order.

        A committed part that equals the oldest guess still open (given for this origin or an
        earlier one) confirms that guess (its answer stands). Any other committed part goes in
        before the open guesses, which are withdrawn, those for later origins given again after
        it. An origin done without its part leaves its guess open: the processor before may hold
        the part and let it go unchanged with a later one (a guard waiting for its window's
        verdict), and then the answer given in advance stands, with no second trip to the
        sidecar; what is still open at the stream's end is withdrawn (`_close_guesses`).

        After a cut (an earlier member's abort) too: the parts committed to `member` then come
        from group inputs before the abort, and the sequential pipeline passes them through it
        before the tripwire (left unconfirmed, its head was a guess `_step` cannot commit: the
        run never ended).
        """
        if member.failed_open:
            return
        _settled(member, origin)
        at = member.firm
        guess = member.open_guess(origin)
        if guess is not None and part is not None and part == guess.part:
            guess.origin = None
            member.firm += 1
            self.count(member, "committed")
            return
        if part is None:
            # The origin is done without its part (or nothing was guessed for it): a guess left
            # is kept, for the processor before may let the part go unchanged later (a guard
            # holding a window until its verdict); a later part that differs withdraws it.
            return
        withdrawn = member.withdraw(at)
        if part is not None:
            member.feed(part, None)
        # The later guesses are given again, still speculative, after this round's commits
        # (`_give_again`), not here: a processor that holds every part (a guard waiting for its
        # window's verdict) withdraws the next one's guess at every part, and giving the rest
        # again each time cost the round O(n²) feeds (a 2,000-character answer: 174,000).
        member.again.extend(e for e in withdrawn if e.origin is not None and e.origin > origin)

    def _give_again(self, member: Member) -> None:
        """Give `member` again, still speculative, the guesses withdrawn this round whose origins
        are not settled yet (`_reconcile`), after its committed parts, in origin order."""
        again = member.again
        if not again:
            return
        if member.failed_open or self.cut_at is not None or self.done:
            again.clear()
            return
        while again:
            entry = again.popleft()
            member.feed(entry.part, entry.origin)

    def shutdown(self) -> list[asyncio.Task[None]]:
        """Cancel every session; the tasks to await. Answers not committed are discarded."""
        tasks: list[asyncio.Task[None]] = []
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.unfold(self)  # its guesses still open are counted discarded
        for member in self.members:
            self.count(member, "discarded", sum(1 for e in member.fed if e.origin is not None))
            member.fed.clear()
            member.cancel()
            member.parts.flush()
            tasks += member.tasks
            for outcome, n in member.counts.items():
                if n:
                    labels = (*self.caller.series(member.handle), HOOK, outcome)
                    self.caller.metrics.speculative_calls.labels(*labels).inc(n)
        return tasks

    def release(self) -> None:
        """Let go of every part the group holds, once its tasks are done. The group and its
        members refer to each other (and their tasks, calls and timers to them), so only the
        cycle collector would free them: each run's committed parts (a member's `replay`) and
        their arenas waited for a full collection, which then had them all to walk (bench P2)."""
        for member in self.members:
            member.release()
        self._encodings.clear()
        self.lane = None


def _settled(member: Member, origin: int) -> None:
    """Group input `origin` is settled for `member` (its committed parts, or its mark, came): the
    guesses withdrawn this round for it and earlier ones are not given again."""
    again = member.again
    while again and again[0].origin is not None and again[0].origin <= origin:
        again.popleft()
