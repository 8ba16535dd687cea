"""A replay's report: per run, its decision changes (or why it stopped, or why it could not be
replayed), and a summary: the runs whose outcome changes, what each processor of the candidate
blocks, masks and retries (a monitor's would-be counted), the latency each adds, and the judge
model calls the candidate's guards made through its gateway."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.replay.diff import Change, compared, diff, processor
from procmesh_orchestrator.replay.recorded import ReplayStopped
from procmesh_orchestrator.replay.runner import Replayed
from procmesh_orchestrator.replay.source import RecordedRun

EXIT_SAME = 0
"""`procmesh replay`'s exit code when no replayed run's decisions change."""
EXIT_CHANGED = 3
"""Its exit code when a run's decisions change or a run stops where the record no longer applies
(1 is an error: an unknown run, a run without recorded inputs, a candidate that does not start)."""

_COUNTED = {"abort": "block", "rewrite": "mask", "drop": "mask", "retry": "retry"}


@dataclass
class RunReport:
    """One run of the replay."""

    run_id: str
    agent_id: str
    changes: list[Change] = field(default_factory=list)
    stopped: ReplayStopped | None = None
    not_replayable: str | None = None
    """Why the run could not be replayed (no recorded inputs)."""
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        """Its decisions change, or the record stops applying somewhere."""
        return bool(self.changes) or self.stopped is not None

    def to_json(self) -> dict[str, Any]:
        """The JSON report's form."""
        stopped = None if self.stopped is None else {"step": self.stopped.step, "reason": self.stopped.reason}
        return {
            "runId": self.run_id,
            "agentId": self.agent_id,
            "changed": self.changed,
            "changes": [c.to_json() for c in self.changes],
            "stopped": stopped,
            "notReplayable": self.not_replayable,
        }


class Report:
    """The runs of one replay, and their summary."""

    def __init__(self) -> None:
        self.runs: list[RunReport] = []
        self._counts: dict[str, dict[str, float]] = defaultdict(
            lambda: {"block": 0, "mask": 0, "retry": 0, "addedLatencyMs": 0.0}
        )
        self._judge_calls: Counter[str] = Counter()

    def not_replayable(self, run: RecordedRun) -> None:
        """A run with a decision record but no recorded inputs: listed, not skipped."""
        self.runs.append(RunReport(run.run_id, run.agent_id, not_replayable="no recorded inputs"))

    def add(self, run: RecordedRun, replayed: Replayed) -> RunReport:
        """A replayed run: its diff, and its candidate's decisions into the summary's counts."""
        stopped_at = None if replayed.stopped is None else replayed.stopped.step
        recorded, candidate = compared(run.decisions, replayed.decisions, stopped_at)
        report = RunReport(run.run_id, run.agent_id, diff(recorded, candidate), replayed.stopped)
        report.seconds = replayed.seconds
        self._judge_calls.update(replayed.judge_calls)
        for d in candidate.values():
            counts = self._counts[processor(d)]
            kind = _COUNTED.get(d.would or d.outcome)
            if kind is not None:
                counts[kind] += 1
            counts["addedLatencyMs"] += d.latency_ms
        for d in recorded.values():
            self._counts[processor(d)]["addedLatencyMs"] -= d.latency_ms
        self.runs.append(report)
        return report

    @property
    def changed(self) -> bool:
        """Whether any run changed (`EXIT_CHANGED`)."""
        return any(r.changed for r in self.runs)

    def summary(self) -> dict[str, Any]:
        """Runs replayed and changed, stops, runs not replayable, and per processor of either side:
        the candidate's block / mask / retry counts and its added latency (ms, summed over runs);
        the judge model calls, in total and per calling processor (as the gateway names it)."""
        processors = {
            name: {**counts, "addedLatencyMs": round(counts["addedLatencyMs"], 3)}
            for name, counts in sorted(self._counts.items())
        }
        return {
            "runs": len(self.runs),
            "replayed": sum(r.not_replayable is None for r in self.runs),
            "changed": [r.run_id for r in self.runs if r.changed],
            "stopped": [r.to_json()["stopped"] | {"runId": r.run_id} for r in self.runs if r.stopped],
            "notReplayable": [r.run_id for r in self.runs if r.not_replayable],
            "processors": processors,
            "judgeCalls": {
                "total": sum(self._judge_calls.values()),
                "processors": dict(sorted(self._judge_calls.items())),
            },
        }

    def to_json(self) -> dict[str, Any]:
        """The whole report (`procmesh replay --json`, ``GET /api/replays/{id}``'s result)."""
        return {"changed": self.changed, "runs": [r.to_json() for r in self.runs], "summary": self.summary()}

    def text(self) -> str:
        """The report for a terminal: each run's changes, then the summary."""
        lines = []
        for r in self.runs:
            if r.not_replayable:
                lines.append(f"run {r.run_id}: not replayable: {r.not_replayable}")
                continue
            lines.append(f"run {r.run_id}: {'CHANGED' if r.changed else 'no change'}")
            for c in r.changes:
                part = "" if c.part is None else f"#{c.part}"
                was, now = c.recorded or "(none)", c.candidate or "(none)"
                lines.append(f"  step {c.step}\t{c.hook}{part}\t{c.processor} ({c.entry})\t{was} -> {now}")
            if r.stopped is not None:
                lines.append(f"  stopped at step {r.stopped.step}: {r.stopped.reason}")
        s = self.summary()
        lines.append(
            f"{s['replayed']} of {s['runs']} runs replayed; {len(s['changed'])} changed, "
            f"{len(s['stopped'])} stopped, {len(s['notReplayable'])} not replayable (no recorded inputs)"
        )
        for name, counts in s["processors"].items():
            lines.append(
                f"  {name}: block {counts['block']:g}, mask {counts['mask']:g}, retry {counts['retry']:g}, "
                f"added latency {counts['addedLatencyMs']:+.1f} ms"
            )
        judged = ", ".join(f"{name} {n}" for name, n in s["judgeCalls"]["processors"].items())
        lines.append(f"judge calls: {s['judgeCalls']['total']}" + (f" ({judged})" if judged else ""))
        return "\n".join(lines)
