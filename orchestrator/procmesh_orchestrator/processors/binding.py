"""Lane entries bound to the sidecars that host them: an agent's lanes, the default error
processors, workflows and lanes chosen by request context.

`LaneBinder` binds over one `SidecarCatalog` (the connected sidecars of one config); every
problem is a `ConfigError` naming the config key (``agents.a.outputProcessors.0``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from procmesh import convert
from procmesh_orchestrator.config import (
    BUILTINS,
    ConditionalStep,
    LaneEntry,
    ParallelStep,
    ProcessorRef,
    WorkflowRef,
)
from procmesh_orchestrator.config.agents import AgentConfig
from procmesh_orchestrator.config.conditions import decided_per_call
from procmesh_orchestrator.config.cost import PROCESSOR_NAMES as COST_NAMES
from procmesh_orchestrator.config.lanes import LaneByContext, TryStep, WorkflowConfig, option_models
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.processors import options
from procmesh_orchestrator.processors.catalog import SidecarCatalog
from procmesh_orchestrator.processors.lanes import (
    Conditional,
    Gated,
    LaneItem,
    ParallelGroup,
    ProcessorHandle,
    TryCatch,
    hook_names,
)
from procmesh_orchestrator.run.framework.cost import CostSlot
from procmesh_orchestrator.run.types import ContextLane, LaneFunction, Lanes

LaneSource = Callable[[Mapping[str, Any]], Sequence[str | Mapping[str, Any]]]
"""Your lane function for `App`'s ``lanes=``: the request context in, the lane's entries out as
the config writes them (the seeds' ``inputProcessors: ({ requestContext }) => [...]``)."""

_ENTRY: TypeAdapter[LaneEntry] = TypeAdapter(LaneEntry)

DEFAULT_ERROR_PROCESSORS = (
    "provider-history-compat",
    "prefill-error-handler",
    "unsupported-file-handler",
    "stream-error-retry-processor",
)
"""The default error processors, in the default order (SPEC §5)."""


def merge_error_defaults(
    user: list[ProcessorHandle], defaults: list[ProcessorHandle]
) -> list[ProcessorHandle]:
    """Add each default whose id the user's list lacks, placed by the default order.

    The user's processors keep their order. A missing default goes before the
    first listed default-id processor that comes later in the default order,
    else after the last one that comes earlier, else at the end.
    """
    rank = {pid: i for i, pid in enumerate(DEFAULT_ERROR_PROCESSORS)}
    out = list(user)
    present = {h.processor_id for h in user}
    for handle in sorted(defaults, key=lambda h: rank[h.processor_id]):
        if handle.processor_id in present:
            continue
        k = rank[handle.processor_id]
        later = [i for i, h in enumerate(out) if rank.get(h.processor_id, -1) > k]
        earlier = [i for i, h in enumerate(out) if -1 < rank.get(h.processor_id, -1) < k]
        pos = later[0] if later else (earlier[-1] + 1 if earlier else len(out))
        out.insert(pos, handle)
        present.add(handle.processor_id)
    return out


class LaneBinder:
    """Binds lane entries (``sidecar/id`` strings, `ProcessorRef`, ``workflow:NAME``) to the
    processors `sidecars` host, with their options checked against each one's schema."""

    def __init__(self, sidecars: SidecarCatalog, workflows: Mapping[str, WorkflowConfig]) -> None:
        self.sidecars = sidecars
        self.workflows = workflows

    def lanes(
        self, agent_id: str, agent: AgentConfig, functions: Mapping[str, LaneSource] | None = None
    ) -> Lanes:
        """The agent's lanes, bound; the error lane with the default error processors it lacks.

        `functions` (``input``, ``output``) replace the config's lane by a function of the request
        context (`App`'s ``lanes=``), whose entries are bound as each run starts."""
        where = f"agents.{agent_id}"
        functions = functions or {}
        for lane, field in (("input", "inputProcessors"), ("output", "outputProcessors")):
            if lane in functions and (
                getattr(agent, f"{lane}_processors") or getattr(agent, f"{lane}_processors_by_context")
            ):
                raise ConfigError(
                    f"{where}.{field}: App's lanes= gives this agent's {lane} lane as a function; "
                    f"the config's {field} (or {field}ByContext) must then be left out"
                )
        if unknown := sorted(set(functions) - {"input", "output"}):
            raise ConfigError(f"App lanes= for agent {agent_id!r}: unknown lanes {unknown} (input, output)")
        return Lanes(
            input=self.function_lane(functions["input"], f"{where}.inputProcessors")
            if "input" in functions
            else tuple(self.input_lane(agent.input_processors, f"{where}.inputProcessors")),
            output=self.function_lane(functions["output"], f"{where}.outputProcessors")
            if "output" in functions
            else tuple(self.resolve_lane(agent.output_processors, f"{where}.outputProcessors")),
            error=tuple(
                self.error_lane(
                    agent.error_processors, agent.error_processor_defaults, f"{where}.errorProcessors"
                )
            ),
            input_by_context=self.context_lane(
                agent.input_processors_by_context, f"{where}.inputProcessorsByContext"
            ),
            output_by_context=self.context_lane(
                agent.output_processors_by_context, f"{where}.outputProcessorsByContext"
            ),
        )

    def input_lane(self, entries: Sequence[LaneEntry], where: str) -> list[LaneItem | CostSlot]:
        """An agent's static input lane bound, its ``token-cost-control`` entry (the orchestrator's
        own, `AgentConfig.cost_limit`) as the place where each run's cost check runs."""
        items: list[LaneItem | CostSlot] = []
        for i, entry in enumerate(entries):
            if isinstance(entry, ProcessorRef) and entry.processor in COST_NAMES:
                items.append(CostSlot())
            else:
                items += self.resolve_lane([entry], where, first=i)
        return items

    def error_lane(self, refs: Sequence[ProcessorRef], defaults: bool, where: str) -> list[ProcessorHandle]:
        """The error lane's entries, and (`defaults`) each default error processor they lack."""
        user = self.resolve(refs, where)
        if not defaults:
            return user
        return merge_error_defaults(
            user, self.resolve([f"{BUILTINS}/{pid}" for pid in DEFAULT_ERROR_PROCESSORS])
        )

    def resolve(
        self, refs: Sequence[LaneEntry | str | dict[str, Any]], where: str = "processors"
    ) -> list[ProcessorHandle]:
        """Bind processor references (``sidecar/id`` strings or ProcessorRef) to their sidecars."""
        return [self.bind(raw, f"{where}.{i}") for i, raw in enumerate(refs)]

    def bind(self, raw: LaneEntry | str | dict[str, Any], where: str) -> ProcessorHandle:
        """One processor reference bound: what to call, with which options and failure policy."""
        if isinstance(raw, WorkflowRef):
            raise ConfigError(f"{where}: a workflow cannot be used here")
        ref = (
            raw
            if isinstance(raw, ProcessorRef)
            else ProcessorRef.model_validate({"processor": raw} if isinstance(raw, str) else raw)
        )
        if ref.processor in COST_NAMES:
            raise ConfigError(
                f"{where}: {ref.processor} goes in the agent's inputProcessors in the config (the "
                "orchestrator runs it; one per agent, kept when a call replaces the lane)"
            )
        if ref.when is not None:
            raise ConfigError(
                f"{where}.when: a condition goes on an input or output lane's entry or a workflow's "
                "plain step (not in the error lane, a parallel branch or a conditional's branch)"
            )
        sidecar = self.sidecars.sidecars.get(ref.sidecar)
        hosted = self.sidecars.processors.get(ref.sidecar)
        if sidecar is None or hosted is None:
            raise ConfigError(f"{where}: unknown or unconnected sidecar {ref.sidecar!r}")
        info = hosted.get(ref.processor_id)
        if info is None:
            raise ConfigError(
                f"{where}: sidecar {ref.sidecar!r} does not host processor "
                f"{ref.processor_id!r} (it hosts {sorted(hosted)})"
            )
        bound = options.bind(ref.processor, ref.options, info.options_schema_json, where)
        if ref.speculative and not info.speculative:
            raise ConfigError(
                f"{where}.speculative: processor {ref.processor!r} does not declare itself "
                "speculative in Describe (only a processor may say its calls can be thrown away)"
            )
        shadow = ref.mode == "monitor"
        judged = any(True for _ in option_models(ref.options))
        # a judge the gateway may merge with its neighbours' is never fused behind one: a fused
        # request runs its members one after another, and merging needs their calls in flight at once
        merges = judged and ref.options.get("merge_judge", True) is not False
        return ProcessorHandle(
            key=ref.processor if ref.name is None else f"{ref.processor}#{ref.name}",
            processor_id=ref.instance,
            hosted_id=ref.processor_id,
            client=self.sidecars.clients[ref.sidecar],
            options=convert.to_struct(bound.static),
            fixed_options=bound.fixed if bound.taken else None,
            context_options=bound.taken,
            options_problem=bound.problem if bound.taken else None,
            hooks=hook_names(info.hooks),
            process_data_parts=info.process_data_parts,
            timeout=ref.timeout or sidecar.timeout,
            stream_timeout=ref.stream_timeout or sidecar.stream_timeout,
            sidecar=ref.sidecar,
            on_failure="fail-open" if shadow else ref.on_failure or sidecar.on_failure,
            shadow=shadow,
            speculative=info.speculative and ref.speculative is not False,
            judged=judged,
            # a shadow processor's verdict is not the run's: it never shares a request
            fuse_key=ref.sidecar if ref.sidecar in self.sidecars.fusing and not shadow and not merges else "",
        )

    def function_lane(self, source: LaneSource, where: str) -> LaneFunction:
        """A lane function whose entries (``sidecar/id``, ``workflow:NAME`` or a lane entry as a
        mapping, as the config writes them) are bound here as each run starts; a bad entry is a
        ConfigError naming it (``agents.a.inputProcessors.1``)."""

        def lane(request_context: Mapping[str, Any]) -> list[LaneItem]:
            entries = []
            for i, raw in enumerate(source(request_context)):
                try:
                    entries.append(raw if isinstance(raw, str) else _ENTRY.validate_python(raw))
                except ValidationError as exc:
                    problem = exc.errors()[0]
                    raise ConfigError(f"{where}.{i}: {problem['msg']} ({raw!r})") from None
            return self.resolve_lane(entries, where)

        return lane

    def context_lane(self, chosen: LaneByContext | None, where: str) -> ContextLane | None:
        """Bind every case and the default of a lane chosen from the request context."""
        if chosen is None:
            return None
        return ContextLane(
            key=chosen.key,
            cases={
                name: tuple(self.resolve_lane(lane, f"{where}.cases.{name}"))
                for name, lane in chosen.cases.items()
            },
            default=tuple(self.resolve_lane(chosen.default, f"{where}.default")),
        )

    def resolve_lane(self, entries: Sequence[LaneEntry | str], where: str, first: int = 0) -> list[LaneItem]:
        """Bind a lane's entries (numbered from `first` in errors); a ``workflow:NAME`` entry
        becomes its steps, in order."""
        items: list[LaneItem] = []
        for i, raw in enumerate(entries, start=first):
            entry = raw
            if isinstance(raw, str):
                entry = (
                    WorkflowRef(workflow=raw[len("workflow:") :])
                    if raw.startswith("workflow:")
                    else (ProcessorRef(processor=raw))
                )
            if isinstance(entry, ProcessorRef):
                items.append(self._entry(entry, f"{where}.{i}"))
                continue
            assert isinstance(entry, WorkflowRef)
            if entry.workflow not in self.workflows:
                raise ConfigError(f"{where}.{i}: unknown workflow {entry.workflow!r}")
            items += self.workflow(entry.workflow)
        return items

    def workflow(self, name: str) -> list[LaneItem]:
        """A workflow's steps bound, in order; a nested workflow's steps in its step's place
        (the config refused cycles)."""
        items: list[LaneItem] = []
        for j, step in enumerate(self.workflows[name].steps):
            at = f"workflows.{name}.steps.{j}"
            if isinstance(step, WorkflowRef):
                items += self.workflow(step.workflow)
            elif isinstance(step, ParallelStep):
                items.append(self._parallel(step, at, name, f"workflow:{name}/{j}"))
            elif isinstance(step, TryStep):
                items.append(
                    TryCatch(
                        key=f"workflow:{name}/{j}",
                        attempt=self._caught(step.try_, f"{at}.try", name, f"workflow:{name}/{j}/try"),
                        fallback=self._caught(step.catch, f"{at}.catch", name, f"workflow:{name}/{j}/catch"),
                    )
                )
            elif isinstance(step, ConditionalStep):
                then = self.resolve(step.then, f"{at}.then")
                otherwise = self.resolve(step.otherwise, f"{at}.otherwise")
                if decided_per_call(step.when):
                    items += [_gated(h, step.when, True, f"{at}.then.{i}") for i, h in enumerate(then)]
                    items += [
                        _gated(h, step.when, False, f"{at}.otherwise.{i}") for i, h in enumerate(otherwise)
                    ]
                else:
                    items.append(Conditional(when=step.when, then=tuple(then), otherwise=tuple(otherwise)))
            else:
                items.append(self._entry(step, at))
        return items

    def _parallel(self, step: ParallelStep, at: str, workflow: str, key: str) -> ParallelGroup:
        branches = tuple(self.resolve(step.parallel, f"{at}.parallel"))
        if step.map is None or isinstance(step.map, str):
            ids = [f"processor:{b.processor_id}" for b in branches]
            pick = ids.index(step.map) if step.map else 0
            return ParallelGroup(key=key, processor_id=workflow, branches=branches, pick=pick)
        # a merge streams through (and answers failures as) the branch whose fields win a tie
        pick = 0 if step.map.merge == "first" else len(branches) - 1
        return ParallelGroup(
            key=key, processor_id=workflow, branches=branches, pick=pick, merge=step.map.merge
        )

    def _caught(
        self, step: ParallelStep | ProcessorRef, at: str, workflow: str, key: str
    ) -> ProcessorHandle | ParallelGroup:
        """One side of an error step bound."""
        if isinstance(step, ParallelStep):
            return self._parallel(step, at, workflow, key)
        return self.bind(step, at)

    def _entry(self, ref: ProcessorRef, where: str) -> LaneItem:
        """A lane entry or a workflow's plain step bound; with a `when`, run only when it holds."""
        if ref.when is None:
            return self.bind(ref, where)
        handle = self.bind(ref.model_copy(update={"when": None}), where)
        if decided_per_call(ref.when):
            return _gated(handle, ref.when, True, where)
        return Conditional(when=ref.when, then=(handle,))


NO_MESSAGES = ("process_output_stream", "process_llm_response")
"""Hooks given no messages: a processor with one of them cannot sit behind a condition on the call."""


def _gated(handle: ProcessorHandle, when: Any, holds: bool, where: str) -> Gated:
    """A processor behind a condition on the call (decided at each hook call)."""
    hooks = [h for h in NO_MESSAGES if handle.has(h)]
    if hooks:
        raise ConfigError(
            f"{where}: processor {handle.processor_id!r} implements {', '.join(hooks)}, which is given "
            "no messages, so a condition on the call (message, stepNumber, retryCount) cannot decide "
            "it; place it outside the condition, or test the request context"
        )
    return Gated(key=f"{handle.key}?{where}", item=handle, when=when, holds=holds)
