"""Partial results in a speculative group (`speculative_stream`): parts a processor lets go while
it still processes a part, handed on as soon as they can be.

A partial result of a committed part is handed on at once (`early`). A guard given every part
in advance holds them and lets them go in partial results of the step's last part, a guess
confirmed only once the processor before let every window go; so a partial result of a guess is
handed on before that (`ahead`) when it lets go, unchanged, committed parts the processor
dropped (`held` keeps them), behind guesses it answered by dropping them without effects. What
it lets go then comes first in its output whatever those guesses turn out to be; if they are
withdrawn, what it commits again must start with those parts (`unahead`), or it broke the
contract (a malformed answer: a released part is final).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError
from procmesh_orchestrator.processors.speculative_member import UNCHANGED
from procmesh_orchestrator.processors.stream_call import CHUNK, Item

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.speculative_member import Member
    from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup


def early(group: SpeculativeGroup, j: int, seq: int, origin: int) -> bool:
    """Hand on the partial results member j gave for the committed part `seq` (its answer is
    still to come); whether there were any."""
    member = group.members[j]
    partials = member.partials.get(seq)
    handed = member.handed.get(seq, 0)
    if not partials or len(partials) == handed:
        return False
    member.handed[seq] = len(partials)
    try:
        items = [i for p in partials[handed:] for i in member.items(p, group.announce_signals)]
        items = unahead(member, items)
    except MalformedResponseError as exc:
        member.broken = str(exc)
        return group._failure(j)
    held(member, None, items)
    group._hand_on(j, items, origin)
    return True


def ahead(group: SpeculativeGroup, j: int) -> bool:
    """Hand on a partial result of a guess before it is confirmed, when it lets go, unchanged,
    committed parts member j dropped, and every part it was given before that guess is a
    guess it answered by dropping it without effects (module doc); whether it did."""
    member = group.members[j]
    if (
        not member.partials
        or member.inbox
        or member.failed_open
        or member.broken is not None
        or group.cut_at is not None
        or (member.early and member.early[0][0] == 0)
    ):
        return False
    quiet = member.quiet
    for entry in member.fed:
        if entry.origin is None:
            return False
        answer = member.answers.get(entry.seq)
        partials = member.partials.get(entry.seq, [])
        if answer is not None:
            if answer is UNCHANGED or answer.HasField("part") or answer.effects != quiet or partials:
                return False
            continue
        fresh = partials[member.handed.get(entry.seq, 0) :]
        if not fresh or any(p.effects != quiet for p in fresh):
            return False
        chunks = [c for p in fresh if p.HasField("part") for c in (p.part, *p.extra_parts)]
        dropped = member.dropped
        if len(chunks) > len(dropped) or any(c != dropped[i] for i, c in enumerate(chunks)):
            return False
        for chunk in chunks:
            dropped.popleft()
            member.early.append((entry.seq, chunk))
        member.handed[entry.seq] = len(partials)
        group._hand_on(j, [(CHUNK, c) for c in chunks], entry.origin)
        return True
    return False


def unahead(member: Member, items: list[Item]) -> list[Item]:
    """`items` without the parts handed on early from guesses later withdrawn, which must be
    the first parts among them (`Member.early`, seq 0)."""
    early = member.early
    if not early or early[0][0] != 0:
        return items
    out: list[Item] = []
    for kind, value in items:
        if kind == CHUNK and early and early[0][0] == 0:
            if value != early[0][1]:
                raise MalformedResponseError("a part let go early did not come first again after a rewind")
            early.popleft()
            continue
        out.append((kind, value))
    return out


def held(member: Member, part: tpb.Chunk | None, items: list[Item]) -> None:
    """Keep `Member.dropped` (what `_ahead` may hand on early): the parts in `items` let go
    the oldest dropped ones; `part` (a committed part just answered) is dropped when its answer
    did not hand it on."""
    dropped = member.dropped
    chunks = [value for kind, value in items if kind == CHUNK]
    for chunk in chunks:
        if dropped and chunk == dropped[0]:
            dropped.popleft()
    if part is not None and not any(c == part for c in chunks):
        dropped.append(part)
