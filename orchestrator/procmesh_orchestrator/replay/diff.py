"""The decision diff of one replayed run: the recorded decisions against the candidate's, matched
by where each was made (lane entry, processor, hook, step, stream part offset; the nth such
decision when a retry makes it again), compared by outcome (and what a monitor would have done).
A pass where the other run made no decision (a processor added or removed, a step that no longer
runs) is no change: it did nothing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.store.decisions import Decision

Key = tuple[int, str, str, str, int, int]
"""(step, entry, processor, hook, part offset or -1, nth)."""


def outcome(d: Decision) -> str:
    """A decision's outcome as the diff shows it: ``monitor:abort`` for a monitor's would-be."""
    return f"{d.outcome}:{d.would}" if d.would else d.outcome


def processor(d: Decision) -> str:
    """The processor as the summary names it: ``sidecar/processor``."""
    return f"{d.sidecar}/{d.processor}"


@dataclass(frozen=True)
class Change:
    """A decision the candidate makes otherwise: None on a side means that side made none there."""

    step: int
    entry: str
    processor: str
    hook: str
    part: int | None
    recorded: str | None
    candidate: str | None

    def to_json(self) -> dict[str, Any]:
        """The JSON report's form."""
        return {
            "step": self.step,
            "entry": self.entry,
            "processor": self.processor,
            "hook": self.hook,
            "part": self.part,
            "recorded": self.recorded,
            "candidate": self.candidate,
        }


def _keyed(decisions: list[Decision]) -> dict[Key, Decision]:
    seen: Counter[tuple[int, str, str, str, int]] = Counter()
    keyed: dict[Key, Decision] = {}
    for d in decisions:
        where = (d.step, d.entry, d.processor, d.hook, -1 if d.part is None else d.part)
        keyed[(*where, seen[where])] = d
        seen[where] += 1
    return keyed


def _judged(decisions: list[Decision]) -> list[Decision]:
    return [d for d in decisions if d.hook != "execute_tool"]


def compared(
    recorded: list[Decision], candidate: list[Decision], stopped_at: int | None = None
) -> tuple[dict[Key, Decision], dict[Key, Decision]]:
    """Both runs' decisions by where each was made, as far as a replay that stopped at step
    `stopped_at` can compare them: every decision before that step, and at it those the candidate
    made before it stopped (a recorded one it never got to is not known to change). Tool runs
    (``execute_tool``) are left out: a replay answers them from the record."""
    old, new = _keyed(_judged(recorded)), _keyed(_judged(candidate))
    if stopped_at is not None:
        new = {k: d for k, d in new.items() if k[0] <= stopped_at}
        old = {k: d for k, d in old.items() if k[0] < stopped_at or (k[0] == stopped_at and k in new)}
    return old, new


def diff(old: dict[Key, Decision], new: dict[Key, Decision]) -> list[Change]:
    """Every place where the two runs' decisions (`compared`) differ, in step order."""
    changes = []
    for key in sorted(old.keys() | new.keys(), key=lambda k: (k[0], k[1], k[3], k[2], k[4], k[5])):
        was, now = old.get(key), new.get(key)
        if was is not None and now is not None and outcome(was) == outcome(now):
            continue
        either = now or was
        assert either is not None
        if (was is None or now is None) and outcome(either) == "pass":
            continue  # a pass where the other run made no decision changes nothing it did
        changes.append(
            Change(
                step=either.step,
                entry=either.entry,
                processor=processor(either),
                hook=either.hook,
                part=either.part,
                recorded=None if was is None else outcome(was),
                candidate=None if now is None else outcome(now),
            )
        )
    return changes
