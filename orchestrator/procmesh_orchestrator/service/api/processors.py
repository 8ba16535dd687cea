"""The processors the sidecars host, as the HTTP API lists and runs them, and per-call lanes.

``listProcessors``/``getProcessor(id).details()`` show each processor a sidecar's ``Describe``
lists (and each processor workflow, `processor_execute` runs a phase of either); `bind_lanes`
binds a call's per-call processor lists (``inputProcessors``, ...: ids of these processors) for
both APIs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.config.lanes import ProcessorRef, WorkflowRef, workflow_refs
from procmesh_orchestrator.errors import ConfigError, RequestContextError
from procmesh_orchestrator.processors import call_lanes
from procmesh_orchestrator.processors.call_lanes import Hosted
from procmesh_orchestrator.processors.lanes import Conditional, LaneItem
from procmesh_orchestrator.run.framework.prepare_step import StepModelError
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, CatalogNotFoundError, ForbiddenError
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.config.schema import Config
    from procmesh_orchestrator.service.api.core import ServiceCore


def _refs(entries: list[Any], config: Config) -> Iterator[tuple[ProcessorRef | None, str | None]]:
    """The processor references of a lane, workflows' steps included: (ref, None) or (None, workflow)."""
    for entry in entries:
        if isinstance(entry, ProcessorRef):
            yield entry, None
        elif isinstance(entry, WorkflowRef):
            yield None, entry.workflow
            workflow = config.workflows.get(entry.workflow)
            for step in workflow.steps if workflow else []:
                if isinstance(step, WorkflowRef):
                    yield from _refs([step], config)
                else:
                    yield from ((r, None) for r in workflow_refs(step))


def hosted_processors(service: ServiceCore) -> dict[str, Hosted]:
    """Every processor the sidecars host, by id (`call_lanes.hosted_processors`)."""
    return call_lanes.hosted_processors(service.app.pipeline.sidecars)


def find_processor(service: ServiceCore, processor_id: str) -> Hosted:
    hosted = hosted_processors(service)
    found = call_lanes.find_hosted(hosted, processor_id)
    if found is None:
        raise CatalogNotFoundError(f"no processor {label(processor_id)} (hosted: {sorted(hosted)})")
    return found


def _configurations(
    service: ServiceCore, uses: Callable[[list[tuple[ProcessorRef | None, str | None]]], bool]
) -> list[dict[str, Any]]:
    """Each agent lane (input, output) whose references, workflows' steps included, `uses` holds for."""
    config = service.app.config
    return [
        {"agentId": agent_id, "agentName": agent_id, "type": kind}
        for agent_id, agent in config.agents.items()
        for kind in ("input", "output")
        if uses(list(_refs(list(agent.possible_entries(kind)), config)))
    ]


def processor_json(service: ServiceCore, hosted: Hosted, *, listing: bool) -> dict[str, Any]:
    """A processor as ``GET /processors`` (`listing`) or ``GET /processors/:id`` returns it."""
    configurations = _configurations(
        service,
        lambda refs: any(
            r is not None and r.sidecar == hosted.sidecar and r.processor_id == hosted.processor_id
            for r, _ in refs
        ),
    )
    body: dict[str, Any] = {
        "id": hosted.id,
        "name": hosted.name,
        "description": hosted.description,
        "phases": hosted.phases,
        "configurations": configurations,
        "isWorkflow": False,
    }
    if listing:
        body["agentIds"] = sorted({c["agentId"] for c in configurations})
        body["configurations"] = [{"agentId": c["agentId"], "type": c["type"]} for c in configurations]
    return body


def _item_hooks(item: LaneItem) -> frozenset[str]:
    if isinstance(item, Conditional):  # either branch may run
        return frozenset(h for p in (*item.then, *item.otherwise) for h in p.hooks)
    return frozenset(h for h in call_lanes.PHASES if item.has(h))


def workflow_phases(service: ServiceCore, name: str) -> list[str]:
    """The phases a processor workflow runs: those of its steps (nested workflows' included), in
    the reference's order; none when a step no longer binds (its sidecar left after a reload)."""
    try:
        steps = service.app.binder.workflow(name)
    except ConfigError:
        return []
    hooks = frozenset().union(*(_item_hooks(item) for item in steps))
    return [phase for hook, phase in call_lanes.PHASES.items() if hook in hooks]


def workflow_processor_json(service: ServiceCore, name: str, *, listing: bool) -> dict[str, Any]:
    configurations = _configurations(service, lambda refs: any(w == name for _, w in refs))
    body: dict[str, Any] = {
        "id": name,
        "name": f"workflow:{name}",
        "description": f"processor workflow {name!r}",
        "phases": workflow_phases(service, name),
        "configurations": configurations,
        "isWorkflow": True,
    }
    if listing:
        body["agentIds"] = sorted({c["agentId"] for c in configurations})
        body["configurations"] = [{"agentId": c["agentId"], "type": c["type"]} for c in configurations]
    return body


def bind_lanes(service: ServiceCore, agent_id: str, call: AgentCall, caller: Caller) -> AgentCall:
    """The call with its per-call processor lists bound (`call_lanes.bind`), their names kept for
    a snapshot (`CallOptions.processor_names`: a resumed run binds them again), and its lanes
    checked against its request context (a processor option it sets that the processor's schema
    refuses is a 400 naming the processor, the option and the key, before any run starts).

    Replacing an agent's processors drops its guards for the call, so only an operator key may
    (or any caller when no key is configured): a tenant key gets a 403.
    """
    if call.lanes:
        fields = ", ".join(call_lanes.LANE_FIELDS[kind] for kind in call.lanes)
        if not caller.operator:
            raise ForbiddenError(
                f"{fields}: replacing an agent's processors needs an operator key (a PROCMESH_API_KEYS "
                "entry 'key=@operator'): it drops the agent's guards for the call"
            )
        try:
            lanes = service.app.agent(agent_id).spec.lanes
            bound = call_lanes.bind(service.app.binder, lanes, call.lanes)
        except ConfigError as exc:  # names nothing here, or needs options the agent does not give it
            raise BadRequestError(str(exc)) from None
        call.options = replace(
            call.options,
            input_processors=bound.get("input"),
            output_processors=bound.get("output"),
            error_processors=bound.get("error"),
            processor_names={kind: list(ids) for kind, ids in call.lanes.items()},
        )
    try:
        service.agent(agent_id).check_call(call.options)
    except (RequestContextError, StepModelError) as exc:
        raise BadRequestError(str(exc)) from None
    return call
