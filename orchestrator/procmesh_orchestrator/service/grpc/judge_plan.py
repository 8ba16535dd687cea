"""What the judge planner expects of a lane: how many guards ask one judge model about a text,
and which of them are known to ask about every text.

The orchestrator knows each agent's lanes: per agent, judge model and phase, `JudgePlan` keeps
the entries of a lane that name the model (an option ``model``) without ``merge_judge: false``.
Their number is how many questions a text may get (`JudgePlan.count`); the planner sends a group
at once when that many are in.

Some of those entries are **sure** to ask about every text the asker asks about (`JudgePlan.sure`):
the planner waits for a sure guard's question even when it comes late (a loaded machine wakes a
sidecar late), up to its cap, and for the others only while their lane keeps sending. An entry is
not sure when its options or place say it may skip a text: a ``precheck`` (it settles clear cases
without the judge), ``last_message_only`` (it judges only the newest message), a ``when``
condition, ``speculative: false`` (behind a guard that holds the answer, it asks only once the
holder let a window go, which needs the group's verdict), or, in the output phase, windows cut
otherwise than the asker's (``window_size``, ``window_boundary``: another text). An agent with
several lanes for a phase (chosen from the request context) counts a guard sure only when it is
sure in each of them that has the asker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.config import Config, ProcessorRef, WorkflowRef
from procmesh_orchestrator.config.lanes import workflow_processors
from procmesh_orchestrator.service.grpc.judge_sections import SectionRequest

_LANES = {"input": "inputProcessors", "output": "outputProcessors"}
_WINDOW_DEFAULTS = {"window_size": 200, "window_boundary": "sentence"}
"""The stream guards' window options and their defaults (the built-ins' `WindowOptions`)."""


@dataclass(frozen=True)
class PlannedGuard:
    """One lane entry that asks a judge model, as the plan sees it."""

    ids: frozenset[str]
    """The ids its questions may carry (the hosted processor id, the instance name)."""
    sure: bool
    """It asks about every text of its phase that reaches it (see the module's doc)."""
    window: tuple[Any, ...]
    """How it cuts a streamed answer (output: guards with other windows judge other texts)."""


def planned_guard(ref: ProcessorRef) -> PlannedGuard:
    """`ref` as the plan sees it."""
    options = ref.options
    may_skip = (
        options.get("precheck") is not None
        or options.get("last_message_only", False) is not False
        or ref.when is not None
        or ref.speculative is False
    )
    window = tuple(options.get(k, default) for k, default in _WINDOW_DEFAULTS.items())
    return PlannedGuard(frozenset({ref.processor_id, ref.instance}), not may_skip, window)


@dataclass(frozen=True)
class JudgePlan:
    """How many requests of one judge model and phase a run may send about one text, and whose."""

    lanes: Mapping[tuple[str, str, str], tuple[tuple[PlannedGuard, ...], ...]]
    """(agent, model, phase) -> each of its lanes' entries asking that model, merging on."""

    @classmethod
    def of(cls, config: Config) -> JudgePlan:
        """Per agent, model and phase: each lane's entries naming the model, merging on."""
        lanes: dict[tuple[str, str, str], list[tuple[PlannedGuard, ...]]] = {}
        for agent_id, agent in config.agents.items():
            for name, lane in agent.named_lanes():
                phase = next((p for p, field_ in _LANES.items() if name.startswith(field_)), None)
                if phase is None:
                    continue
                by_model: dict[str, list[PlannedGuard]] = {}
                for ref in _lane_refs(config, lane):
                    model = ref.options.get("model")
                    if isinstance(model, str) and ref.options.get("merge_judge", True) is not False:
                        by_model.setdefault(model, []).append(planned_guard(ref))
                for model, guards in by_model.items():
                    lanes.setdefault((agent_id, model, phase), []).append(tuple(guards))
        return cls({k: tuple(v) for k, v in lanes.items()})

    def count(self, request: SectionRequest) -> int:
        """Requests to wait for (1: none but this one): the run's agent's, when the run is live
        here; else the most any agent may send (the window bounds the wait)."""
        if request.agent is not None:
            found = self.lanes.get((request.agent, request.model, request.phase), ())
        else:
            found = tuple(
                lane
                for (_, m, p), lanes in self.lanes.items()
                if (m, p) == (request.model, request.phase)
                for lane in lanes
            )
        return max([1, *(len(lane) for lane in found)])

    def sure(self, request: SectionRequest) -> frozenset[frozenset[str]]:
        """The guards known to ask about `request`'s text too, each as the ids its questions may
        carry (the asker's own included); none when the run is not live here."""
        if request.agent is None:
            return frozenset()
        out: frozenset[frozenset[str]] | None = None
        for lane in self.lanes.get((request.agent, request.model, request.phase), ()):
            asker = next((g for g in lane if request.guard_id in g.ids), None)
            if asker is None:
                continue
            same_text = (g for g in lane if request.phase != "output" or g.window == asker.window)
            sure = frozenset(g.ids for g in same_text if g.sure)
            out = sure if out is None else out & sure
        return out or frozenset()


def _lane_refs(config: Config, lane: list[Any]) -> Iterator[ProcessorRef]:
    for entry in lane:
        if isinstance(entry, WorkflowRef):
            yield from (ref for _, ref in workflow_processors(entry.workflow, config.workflows, ""))
        else:
            yield entry
