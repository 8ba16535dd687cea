"""A speculative group's books while every member passes every part on unchanged (`Lane`).

The general books (`speculative_member`) hold a record per part per member: its committed input
(the part and its mark), what it was fed, its answer and when it came. A stream whose members
all take every part and pass each on as given (a run answered ``unchanged_through``, or a part
given back whole with no effects) needs none of that: every member was fed the same parts at
the same time, with the same seqs, and each member's state is a few counts over one list of
parts — how many it answered, how many it committed. Member j commits its answered parts up to
those member j-1 committed (the first: up to those fed), its guesses confirmed by the commit
before it; the last hands them downstream. A batch, an answer and a commit cost the group a few
list operations, not a dozen per part and member (bench P2).

At the first answer these books cannot hold (anything else, or not from where the member's
last answer ended) or a member's failure, `Lane.unfold` writes them out as the general books
would be at that point, and the group goes on with those (`SpeculativeGroup.unfold`). What
comes down that the lane cannot hold (effects, the stream's end, a part a member does not take)
waits until every member committed the lane's parts, then goes to the general books: the tail
of a stream, in flight when its end comes, is committed on the lane too. A group that keeps a
record of each part's decision never starts on a lane.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.processors.speculative_member import MARK, UNCHANGED, Fed, Member
from procmesh_orchestrator.processors.stream_call import CHUNK, FLOWING, Item

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup


class Lane:
    """The group's parts since its start, fed to every member at once (index i: group input i,
    seq i + 1 in every member's session), and each member's answered and committed counts."""

    def __init__(self, members: list[Member]) -> None:
        self.parts: list[tpb.Chunk] = []
        self.sent: list[int] = []
        """Each batch's end (an index in `parts`), with its send time in `sent_at`."""
        self.sent_at: list[float] = []
        self.answered = [0] * len(members)
        """Parts each member answered (every one of them unchanged)."""
        self.arrived: list[list[int]] = [[] for _ in members]
        """Each member's answers' ends, with when they came in `arrived_at`."""
        self.arrived_at: list[list[float]] = [[] for _ in members]
        self.committed = [0] * len(members)
        self.held: list[Item] = []
        """Upstream items the lane cannot hold, in order, for the general books once it is
        drained (`SpeculativeGroup.advance`)."""

    @staticmethod
    def fits(members: list[Member]) -> bool:
        """A group can start on a lane: no member keeps a record of decisions (each part's)."""
        return not any(m.parts.recording for m in members)

    def take(self, group: SpeculativeGroup, batch: list[Item]) -> bool:
        """Give every member the batch's parts, up to the first item the lane cannot hold (not
        a part, or a part some member does not take), which waits with all after it in `held`
        until every member committed the lane's parts (`advance`); whether the stream ended
        there (an end, an abort or an error came)."""
        n = 0
        if not self.held and healthy(group):
            data = all(m.data_parts for m in group.members)
            for kind, value in batch:
                if kind != CHUNK or (not data and value.type.startswith("data-")):
                    break
                n += 1
        if n:
            self._feed(group, batch[:n])
        self.held += batch[n:]
        return any(kind not in FLOWING for kind, _ in batch[n:])

    def advance(self, group: SpeculativeGroup) -> bool:
        """Commit what can be (`commit`) and send each member's request; whether the lane goes
        on: not once a member broke, failed open or lost its session, or something cut the group,
        nor once it is drained (every member committed every part) with items held."""
        if not healthy(group):
            return False
        self.commit(group)
        if self.held and all(c == len(self.parts) for c in self.committed):
            return False
        for member in group.members:
            member.flush()
            member.parts.flush()
        return True

    def _feed(self, group: SpeculativeGroup, batch: list[Item]) -> None:
        """Give every member the parts (one request's parts, shared: `Member.flush`)."""
        seq = len(self.parts)
        out: list[tuple[int, tpb.Chunk]] = []
        for _, part in batch:
            seq += 1
            out.append((seq, part))
            self.parts.append(part)
        self.sent.append(seq)
        self.sent_at.append(group.now)
        for member in group.members:
            if member.call is None:
                member.open()
            member.out = out
            member.seq = seq
        group.taken += len(batch)

    def answer(self, j: int, member: Member, res: ppb.StreamPartResult, now: float) -> int:
        """Take member j's result if it passes on, unchanged and with nothing else, the parts from
        the first it has not answered on (a run, ``unchanged_through``, or one part given back
        whole: `SpeculativeGroup._passes`'s test); the last seq it answered, or 0 if it did not
        (anything else is the general books')."""
        first, last = res.seq, res.unchanged_through
        if first != self.answered[j] + 1 or res.more or res.extra_parts:
            return 0
        if last:  # a run: nothing but its range
            if last > member.seq or res.HasField("part") or res.HasField("effects"):
                return 0
        else:  # one part: the very part it was given, with no effects (a fused one's all empty)
            if first > member.seq or not res.HasField("part") or res.part != self.parts[first - 1]:
                return 0
            if res.HasField("effects") and res.effects != member.quiet:
                return 0
            last = first
        self.answered[j] = last
        self.arrived[j].append(last)
        self.arrived_at[j].append(now)
        return last

    def waiting_since(self, j: int) -> float | None:
        """When member j's oldest unanswered part was sent (None: it answered every one)."""
        answered = self.answered[j]
        if answered >= len(self.parts):
            return None
        return self.sent_at[bisect.bisect_right(self.sent, answered)]

    def commit(self, group: SpeculativeGroup) -> None:
        """Commit, member by member in lane order, every part a member answered that the one
        before it committed: its guesses for them were right (they came unchanged)."""
        members, parts = group.members, self.parts
        upto = len(parts)  # the first member's input is committed as it comes
        for j, member in enumerate(members):
            start = self.committed[j]
            end = min(self.answered[j], upto)
            if end > start:
                committed = parts[start:end]
                member.replay += committed
                member.committed = end
                self._count(j, member, start, end)
                if j + 1 < len(members):
                    group.count(members[j + 1], "committed", end - start)
                else:
                    group.outq.put_all([(CHUNK, part) for part in committed])
                self.committed[j] = end
            upto = self.committed[j]

    def _count(self, j: int, member: Member, start: int, end: int) -> None:
        """Parts start..end of member j passed: each added the time from its batch's send to
        its answer's arrival (runs of the same time counted at once, `PartCounts.passed`)."""
        sent, sent_at = self.sent, self.sent_at
        arrived, arrived_at = self.arrived[j], self.arrived_at[j]
        s = bisect.bisect_right(sent, start)
        a = bisect.bisect_right(arrived, start)
        at = start
        while at < end:
            upto = min(sent[s], arrived[a], end)
            member.parts.passed(max(0.0, arrived_at[a] - sent_at[s]), upto - at)
            at = upto
            if at == sent[s]:
                s += 1
            if at == arrived[a]:
                a += 1

    def unfold(self, group: SpeculativeGroup) -> None:
        """Write the lane's books out as the general books (module doc): each member's committed
        input (part and mark) it has not committed, what it was fed (that, then its guesses),
        its answers and their times."""
        parts, members = self.parts, group.members
        sent, sent_at = self.sent, self.sent_at
        upto = len(parts)
        for j, member in enumerate(members):
            start = self.committed[j]
            inbox, fed = member.inbox, member.fed
            s = bisect.bisect_right(sent, start)
            for i in range(start, len(parts)):
                if i == sent[s]:
                    s += 1
                firm = i < upto
                if firm:
                    inbox.append((CHUNK, parts[i], i))
                    inbox.append((MARK, None, i))
                fed.append(Fed(i + 1, parts[i], None if firm else i, sent_at[s]))
            member.firm = upto - start
            arrived, arrived_at = self.arrived[j], self.arrived_at[j]
            a = bisect.bisect_right(arrived, start)
            for i in range(start, self.answered[j]):
                if i == arrived[a]:
                    a += 1
                member.answers[i + 1] = UNCHANGED
                member.arrived[i + 1] = arrived_at[a]
            upto = start


def healthy(group: SpeculativeGroup) -> bool:
    """No member of `group` broke, failed open or lost its session, and nothing cut the group."""
    return group.cut_at is None and not any(
        m.broken is not None or m.failed_open or m.lost for m in group.members
    )
