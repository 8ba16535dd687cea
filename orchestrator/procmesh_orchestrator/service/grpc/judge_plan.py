"""What the judge planner expects of a lane: how many guards ask one judge model about a text,
and which of them are certain to ask about a given text.

The orchestrator knows each agent's lanes: per agent, judge model and phase, `JudgePlan` keeps
the entries of a lane that name the model (an option ``model``) without ``merge_judge: false``.
Their number is how many questions a text may get (`JudgePlan.count`), less the built-in guards
certain not to ask about it (no hook in the phase, or a text shorter than their minimum length:
the language detector's ``min_text_length``); the planner sends a group at once when that many
are in.

Some of those entries are **sure** to ask about a text another guard asked about
(`JudgePlan.sure`): the planner waits for a sure guard's question even when it comes late (a
loaded machine wakes a sidecar late), up to its cap, and for the others only while their lane
keeps sending. Waiting for a question that never comes costs the whole cap (1 s), so an entry is
sure only where the plan models every rule that makes it skip a text:

- It is one of the built-in judged guards (`BUILTIN_GUARDS`, on the ``builtins`` sidecar), in a
  phase it has a hook for, enforcing (not ``mode: monitor``), a plain lane entry (not a
  workflow's step), with no ``precheck``, no ``last_message_only``, no ``when`` and not
  ``speculative: false``; in the output phase its windows are cut as the asker's
  (``window_size``, ``window_boundary``). Any other processor, however it asks, is never sure:
  the planner cannot know which texts it skips.
- The text is at least the guard's minimum length (the language detector's ``min_text_length``,
  10 by default; every other built-in asks about any text that is not empty). Roles do not
  matter: the built-ins judge every input message they are given.
- The text is one the guard is given too. The speculative entries of a lane are given its
  input at once (`run.speculation`, `processors.speculative_stream`); an entry that changes a
  text (a redacting, rewriting, translating or filtering strategy, `BuiltinGuard.changes`, or
  any entry the plan does not know) hands the changed text only to the entries after it. A
  guard before the asker: no such entry may stand between them, counting the guard. A guard
  after the asker is given what the asker is, when nothing between them may run apart from them
  (an entry not speculative, monitoring, a workflow's, or unknown); in the output phase only for
  the lane's own text (no entry before the asker may change it): a text changed before the
  asker reaches the entries after it only once the asker let it go, which needs the verdict.

An agent with several lanes for a phase (chosen from the request context) counts a guard sure
only when it is sure in each of them that has the asker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.config import BUILTINS, Config, ProcessorRef, WorkflowRef
from procmesh_orchestrator.config.lanes import workflow_processors
from procmesh_orchestrator.service.grpc.judge_sections import SectionRequest

_LANES = {"input": "inputProcessors", "output": "outputProcessors"}
_WINDOW_DEFAULTS = {"window_size": 200, "window_boundary": "sentence"}
"""The stream guards' window options and their defaults (the built-ins' `WindowOptions`)."""


@dataclass(frozen=True)
class BuiltinGuard:
    """What the plan knows of a built-in judged guard (sidecars/.../builtins/guards/)."""

    phases: frozenset[str]
    """The phases it has a hook for (input: ``processInput``, output: ``processOutputStream``)."""
    strategy: str
    """Its default ``strategy``."""
    changes: frozenset[str]
    """The strategies that may change a text later entries are given (replace it, drop it)."""
    min_length: str | None = None
    """The option giving the shortest text it asks about (`JudgedGuard.min_length`), if any."""
    min_length_default: int = 1


BUILTIN_GUARDS: Mapping[str, BuiltinGuard] = {
    "moderation": BuiltinGuard(frozenset({"input", "output"}), "block", frozenset({"filter"})),
    "pii-detector": BuiltinGuard(frozenset({"input", "output"}), "redact", frozenset({"filter", "redact"})),
    "prompt-injection-detector": BuiltinGuard(
        frozenset({"input"}), "block", frozenset({"filter", "rewrite"})
    ),
    "language-detector": BuiltinGuard(
        frozenset({"input"}), "detect", frozenset({"translate"}), "min_text_length", 10
    ),
    "system-prompt-scrubber": BuiltinGuard(frozenset({"output"}), "redact", frozenset({"filter", "redact"})),
}
"""The built-in judged guards and their skip rules (checked against the sidecars' code by
tests/unit/orchestrator/service/test_judge_plan.py)."""


@dataclass(frozen=True)
class PlannedGuard:
    """One lane entry that asks a judge model, as the plan sees it."""

    ids: frozenset[str]
    """The ids its questions may carry (the hosted processor id, the instance name)."""
    at: int
    """Its place in its lane (a workflow's steps each have one)."""
    min_length: int | None
    """It asks about every text of its phase at least this long that it is given; None: it may
    skip any (see the module's doc)."""
    window: tuple[Any, ...]
    """How it cuts a streamed answer (output: guards with other windows judge other texts)."""
    asks: bool = True
    """It has a hook in its lane's phase (a built-in without one never asks there)."""
    least: int = 0
    """It never asks about a text shorter than this (a built-in's minimum length)."""

    def may_ask(self, length: int) -> bool:
        """Whether it may ask about a text `length` long."""
        return self.asks and length >= self.least


@dataclass(frozen=True)
class PlannedLane:
    """A lane's entries asking one judge model, and where its texts may change."""

    guards: tuple[PlannedGuard, ...]
    changers: tuple[int, ...]
    """The places of the entries that may change a text (or that the plan does not know)."""
    apart: tuple[int, ...]
    """The places of the entries that may run apart from the speculative ones before them."""

    def sure(self, asker: PlannedGuard, guard: PlannedGuard, phase: str, length: int) -> bool:
        """`guard` asks about every text `length` long that `asker` asks about (module's doc)."""
        if guard.min_length is None or length < guard.min_length:
            return False
        if phase == "output" and guard.window != asker.window:
            return False
        if guard.at <= asker.at:
            return not any(guard.at <= c < asker.at for c in self.changers)
        if any(asker.at < a <= guard.at for a in self.apart):
            return False
        return not (phase == "output" and any(c < asker.at for c in self.changers))


def _sure_min_length(ref: ProcessorRef, phase: str, in_workflow: bool) -> int | None:
    """The shortest text `ref` is sure to ask about in `phase`, or None (module's doc)."""
    builtin = BUILTIN_GUARDS.get(ref.processor_id) if ref.sidecar == BUILTINS else None
    options = ref.options
    if (
        builtin is None
        or in_workflow
        or phase not in builtin.phases
        or ref.mode != "enforce"
        or ref.when is not None
        or ref.speculative is False
        or options.get("precheck") is not None
        or options.get("last_message_only", False) is not False
    ):
        return None
    if builtin.min_length is None:
        return 1
    value = options.get(builtin.min_length, builtin.min_length_default)
    if isinstance(value, bool) or not isinstance(value, int):
        return None  # from the request context: not known here
    return max(value, 1)


def _runs_apart(ref: ProcessorRef, in_workflow: bool) -> bool:
    """Whether `ref` may run apart from the speculative entries before it (or the plan cannot tell)."""
    builtin = BUILTIN_GUARDS.get(ref.processor_id) if ref.sidecar == BUILTINS else None
    return builtin is None or in_workflow or ref.mode != "enforce" or ref.speculative is False


def _may_change(ref: ProcessorRef, in_workflow: bool) -> bool:
    """Whether `ref` may change a text the entries after it are given (or the plan cannot tell)."""
    if _runs_apart(ref, in_workflow):
        return True
    strategy = ref.options.get("strategy", BUILTIN_GUARDS[ref.processor_id].strategy)
    return not isinstance(strategy, str) or strategy in BUILTIN_GUARDS[ref.processor_id].changes


def planned_guard(ref: ProcessorRef, at: int, phase: str, in_workflow: bool = False) -> PlannedGuard:
    """`ref`, the `at`-th entry of a `phase` lane, as the plan sees it."""
    window = tuple(ref.options.get(k, default) for k, default in _WINDOW_DEFAULTS.items())
    ids = frozenset({ref.processor_id, ref.instance})
    sure = _sure_min_length(ref, phase, in_workflow)
    builtin = BUILTIN_GUARDS.get(ref.processor_id) if ref.sidecar == BUILTINS else None
    if builtin is None:
        return PlannedGuard(ids, at, sure, window)
    least = 1  # no built-in asks about an empty text
    if builtin.min_length is not None:
        value = ref.options.get(builtin.min_length, builtin.min_length_default)
        least = max(value, 1) if isinstance(value, int) and not isinstance(value, bool) else 1
    return PlannedGuard(ids, at, sure, window, phase in builtin.phases, least)


@dataclass(frozen=True)
class JudgePlan:
    """How many requests of one judge model and phase a run may send about one text, and whose."""

    lanes: Mapping[tuple[str, str, str], tuple[PlannedLane, ...]]
    """(agent, model, phase) -> each of its lanes' entries asking that model, merging on."""

    @classmethod
    def of(cls, config: Config) -> JudgePlan:
        """Per agent, model and phase: each lane's entries naming the model, merging on."""
        lanes: dict[tuple[str, str, str], list[PlannedLane]] = {}
        for agent_id, agent in config.agents.items():
            for name, lane in agent.named_lanes():
                phase = next((p for p, field_ in _LANES.items() if name.startswith(field_)), None)
                if phase is None:
                    continue
                by_model: dict[str, list[PlannedGuard]] = {}
                changers: list[int] = []
                apart: list[int] = []
                for at, (ref, in_workflow) in enumerate(_lane_refs(config, lane)):
                    if _may_change(ref, in_workflow):
                        changers.append(at)
                    if _runs_apart(ref, in_workflow):
                        apart.append(at)
                    model = ref.options.get("model")
                    if isinstance(model, str) and ref.options.get("merge_judge", True) is not False:
                        by_model.setdefault(model, []).append(planned_guard(ref, at, phase, in_workflow))
                for model, guards in by_model.items():
                    planned = PlannedLane(tuple(guards), tuple(changers), tuple(apart))
                    lanes.setdefault((agent_id, model, phase), []).append(planned)
        return cls({k: tuple(v) for k, v in lanes.items()})

    def count(self, request: SectionRequest) -> int:
        """Requests to wait for (1: none but this one): the run's agent's, when the run is live
        here, else the most any agent may send (the window bounds the wait); the built-ins
        certain not to ask about `request`'s text left out."""
        if request.agent is not None:
            found = self.lanes.get((request.agent, request.model, request.phase), ())
        else:
            found = tuple(
                lane
                for (_, m, p), lanes in self.lanes.items()
                if (m, p) == (request.model, request.phase)
                for lane in lanes
            )
        length = len(request.content)
        return max([1, *(sum(g.may_ask(length) for g in lane.guards) for lane in found)])

    def sure(self, request: SectionRequest) -> frozenset[frozenset[str]]:
        """The guards certain to ask about `request`'s text too, each as the ids its questions may
        carry (the asker's own included when it is one); none when the run is not live here."""
        if request.agent is None:
            return frozenset()
        out: frozenset[frozenset[str]] | None = None
        length = len(request.content)
        for lane in self.lanes.get((request.agent, request.model, request.phase), ()):
            asker = next((g for g in lane.guards if request.guard_id in g.ids), None)
            if asker is None:
                continue
            sure = frozenset(g.ids for g in lane.guards if lane.sure(asker, g, request.phase, length))
            out = sure if out is None else out & sure
        return out or frozenset()


def _lane_refs(config: Config, lane: list[Any]) -> Iterator[tuple[ProcessorRef, bool]]:
    """A lane's processor entries in order, each with whether it is a workflow's step."""
    for entry in lane:
        if isinstance(entry, WorkflowRef):
            yield from ((ref, True) for _, ref in workflow_processors(entry.workflow, config.workflows, ""))
        else:
            yield entry, False
