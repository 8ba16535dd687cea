"""One replay, start to end: the recorded runs read from the store (one run, or an agent's in a
time range), the candidate started once, each run replayed and diffed into the `Report`. The CLI
(`procmesh replay`) and the HTTP API's replay jobs (``POST /api/replays``) both run this."""

from __future__ import annotations

from dataclasses import dataclass

from procmesh_orchestrator.config import Config
from procmesh_orchestrator.replay.report import Report
from procmesh_orchestrator.replay.runner import Replayer
from procmesh_orchestrator.replay.source import ReplayError, load_run, runs_between
from procmesh_orchestrator.store.decisions import DecisionStore


@dataclass(frozen=True)
class Selection:
    """Which recorded runs to replay: one run, or an agent's from `since` to before `until`."""

    run_id: str | None = None
    agent_id: str | None = None
    since: str | None = None
    until: str | None = None

    def check(self) -> None:
        """ReplayError unless it names a run, or an agent with since and until (not both)."""
        ranged = (self.agent_id, self.since, self.until)
        if self.run_id is not None and any(v is not None for v in ranged):
            raise ReplayError("replay one run, or an agent's runs in a time range: not both")
        if self.run_id is None and any(v is None for v in ranged):
            raise ReplayError("replay needs a run id, or an agent id with since and until")


async def replay(store: DecisionStore, candidate: Config, selection: Selection) -> Report:
    """Replay the selected runs through `candidate`. ReplayError when the one run asked for is
    unknown or was recorded without its inputs (a range lists such runs as not replayable)."""
    selection.check()
    if selection.run_id is not None:
        runs = [await load_run(store, selection.run_id)]
        if not runs[0].replayable:
            raise ReplayError(
                f"run {selection.run_id!r} is not replayable: no recorded inputs "
                f"(agents.{runs[0].agent_id}.recordInputs was off when it ran)"
            )
    else:
        agent, since, until = selection.agent_id or "", selection.since or "", selection.until or ""
        ids = await runs_between(store, since, until, agent)
        runs = [await load_run(store, run_id) for run_id in ids]
    report = Report()
    async with Replayer(candidate) as replayer:
        for run in runs:
            if run.replayable:
                report.add(run, await replayer.replay(run))
            else:
                report.not_replayable(run)
    return report
