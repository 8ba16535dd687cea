"""Memory in a replay, answered from the record: a recorded run whose agent has memory kept what
memory made of its prompt (``memory-context``: the system messages, the message list once the
history loaded, the tools memory offers; `run.framework.memory.MessageHistory`). The candidate's
run gets exactly that where memory's processors would run, at the head of the input lane: no
store is read and nothing is saved to any thread (a replay writes no thread), so a candidate that
changes nothing shows the model the recorded prompt.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from procmesh_orchestrator.replay.recorded import RecordedModel, RecordedTool
from procmesh_orchestrator.replay.source import RecordedRun
from procmesh_orchestrator.run.framework import FrameworkProcessor
from procmesh_orchestrator.run.framework.history_budget import HistoryBudget
from procmesh_orchestrator.run.framework.memory import trim_prompt
from procmesh_orchestrator.run.hooks import HookArgs, InputArgs, InputStepArgs, LaneEntry
from procmesh_orchestrator.run.types import AgentSpec, Lanes

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

R = TypeVar("R")


class RecordedMemory(FrameworkProcessor):
    """processInput: the call's messages, system messages and unsettled tool results become
    what they were once the recorded run's memory ran. With a recorded token budget,
    processInputStep trims the history from the prompt as memory did (its boundary unwritten)."""

    processor_id = "recorded-memory"
    key = "memory:recorded-memory"

    def __init__(self, context: Mapping[str, Any]) -> None:
        self.context = context
        budget = context.get("budget")
        self.budget = HistoryBudget.of(budget["maxTokens"], budget["atMaxRemoveTokens"]) if budget else None
        self.hooks = frozenset({"process_input", "process_input_step"} if budget else {"process_input"})

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if isinstance(args, InputArgs):
            context = copy.deepcopy(self.context)
            for msg in run.ml.items:
                run.ml.remove(msg["id"])
            for msg, source in context["messages"]:
                run.ml.add(msg, source)
            run.system.extend(context["system"])
            run.unsettled_results = list(context["unsettled"])
        elif isinstance(args, InputStepArgs) and self.budget is not None:
            trim_prompt(run, self.budget)
        return None


@dataclass(frozen=True)
class _Lanes(Lanes):
    """The candidate's lanes with the recorded memory ahead of the input lane, as memory's
    processors are in a live run."""

    memory: FrameworkProcessor | None = None

    def chosen(
        self, lane: str, request_context: Mapping[str, Any], owner: str = "the agent"
    ) -> tuple[LaneEntry, ...]:
        entries = super().chosen(lane, request_context, owner)
        return (self.memory, *entries) if lane == "input" and self.memory is not None else entries


def with_recorded_memory(lanes: Lanes, context: Mapping[str, Any]) -> Lanes:
    """`lanes` with the run's recorded memory (`RecordedMemory`) heading the input lane."""
    fields = {f.name: getattr(lanes, f.name) for f in dataclasses.fields(Lanes)}
    return _Lanes(**fields, memory=RecordedMemory(context))


def memory_tools(context: Mapping[str, Any], model: RecordedModel) -> dict[str, RecordedTool]:
    """The tools the recorded run's memory offered the model (``updateWorkingMemory``), shown as
    recorded and answered from the record."""
    return {
        t["name"]: RecordedTool(t["name"], t["description"], t["inputSchema"], False, model)
        for t in context.get("tools", ())
    }


def answered_from_record(run: RecordedRun, spec: AgentSpec, model: RecordedModel) -> dict[str, Any]:
    """The agent's tools answered from the record and, when the run kept what memory made of its
    prompt, the lanes with that memory ahead and memory's tools first (as a live run offers them)."""
    tools = {name: RecordedTool.of(tool, model) for name, tool in spec.tools.items()}
    if run.memory is None:
        return {"tools": tools}
    lanes = with_recorded_memory(spec.lanes, run.memory)
    return {"tools": {**memory_tools(run.memory, model), **tools}, "lanes": lanes}
