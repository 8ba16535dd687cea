"""A candidate config run live on recorded runs: its sidecars real (connected, or the built-in one
started, as the config says), its agents' model and tools answered from each run's record
(`recorded`), its processors' decisions collected as a live run's are (`DecisionLog`), never
written to the store.

Its judging guards call the candidate's judge models for real, through the candidate's model
gateway (`gateway`), counted per run. The candidate runs without memory, durability, cost control
and violation routes (no webhook is posted): a run whose agent had memory gets what memory made
of its recorded prompt (`memory`; no store is read, no thread written); one recorded without that
stops at its first model call, said so (`ReplayStopped`), rather than pretend.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors.decisions import DecisionLog
from procmesh_orchestrator.replay.gateway import ReplayGateway
from procmesh_orchestrator.replay.memory import answered_from_record
from procmesh_orchestrator.replay.recorded import (
    RecordedCaller,
    RecordedModel,
    RecordedModels,
    ReplayStopped,
)
from procmesh_orchestrator.replay.source import RecordedRun, ReplayError
from procmesh_orchestrator.run import Agent, CallOptions, RunInfo
from procmesh_orchestrator.store.decisions import Decision


def offline(candidate: Config) -> Config:
    """The candidate as a replay runs it: decisions collected, inputs not recorded, no memory,
    no durable runs, no cost control (nothing of a replay goes to the store: its gateway's judge
    calls are not charged to the ledger)."""
    agents = {}
    for agent_id, agent in candidate.agents.items():
        update = {"memory": None, "durable": False, "record_inputs": False, "cost_control": None}
        agents[agent_id] = copy = agent.model_copy(update=update)
        copy._lane_cost = None  # a token-cost-control entry's limit, read at validation
    decisions = candidate.decisions.model_copy(update={"record": True, "record_content": False})
    return candidate.model_copy(update={"agents": agents, "decisions": decisions})


@dataclass
class Replayed:
    """One recorded run replayed through the candidate."""

    decisions: list[Decision]
    stopped: ReplayStopped | None
    seconds: float
    judge_calls: Counter[str] = field(default_factory=Counter)
    """The model calls its judging guards made through the gateway, by calling processor."""


class Replayer:
    """The candidate, started once (``async with``), replaying recorded runs one by one."""

    def __init__(self, candidate: Config, *, metrics: OrchestratorMetrics | None = None) -> None:
        self.app = App(offline(candidate), metrics=metrics or OrchestratorMetrics())
        self.gateway = ReplayGateway(self.app)

    async def __aenter__(self) -> Replayer:
        try:
            await self.app.start(gateway=await self.gateway.start())
        except BaseException:
            await self.gateway.stop()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        # the process's background calls and webhook posts are the serving App's, not the replay's
        await self.app.stop(drain=False)
        await self.gateway.stop()

    async def replay(self, run: RecordedRun) -> Replayed:
        """Run the candidate's agent on the run's recorded input and request context; its model
        and tools answered from the record."""
        if not run.replayable:
            raise ReplayError(f"run {run.run_id!r} is not replayable: no recorded inputs")
        agent = self.app.agents.get(run.agent_id)
        if agent is None:
            raise ReplayError(f"run {run.run_id!r}: the candidate config has no agent {run.agent_id!r}")
        spec = agent.spec
        model = RecordedModel(run, spec.model.model_id)
        logs: list[DecisionLog] = []

        def hook_caller(info: RunInfo, metrics: OrchestratorMetrics) -> Any:
            caller = spec.hook_caller(info, metrics)
            model.info = info
            if isinstance(info.decisions, DecisionLog):
                logs.append(info.decisions)
            return RecordedCaller(caller, model)

        replaying = dataclasses.replace(
            spec,
            model=model,
            fallbacks=(),
            models=RecordedModels(spec.models, model),  # a processor's model switch too
            **answered_from_record(run, spec, model),  # its tools, and its memory as recorded
            memory=None,
            store=None,
            cost=None,
            hook_caller=hook_caller,
            violation_routes={},  # a replay posts no violation webhook
        )
        options = CallOptions(request_context=dict(run.request_context), resource_id=run.resource_id)
        judged = self.gateway.judge_calls()
        started = time.perf_counter()
        try:
            await Agent(replaying, self.app.metrics).generate(run.input, options)
        except Exception as exc:  # a failed run is an outcome too; only a stop of the replay's own is not
            if model.stopped is None and not isinstance(exc, OrchestratorError):
                raise
        took = time.perf_counter() - started
        decisions = [d for log in logs for d in log.take(run.run_id, run.agent_id)[0]]
        return Replayed(decisions, model.stopped, took, self.gateway.judge_calls() - judged)
