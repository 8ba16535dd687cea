"""Per-call processor lists by name: what a caller's ``inputProcessors`` (...) ids bind to.

One resolver for the service (a call's lists, `service.api.processors.bind_lanes`) and for the
orchestrator that resumes a run (its snapshot keeps the names, `run.snapshot.resumed_options`;
`AgentSpec.bind_lanes` is `bind` over the agent's own binder and lanes):
a run approved on another replica, or a durable run taken over, binds them again there. A name
is a processor a sidecar hosts (its id, ``sidecar:id`` when two sidecars share it; bound with the
options the agent's lanes give it, else none) or, in the input and output lanes, a processor
workflow (``NAME`` or ``workflow:NAME``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.processors.binding import LaneBinder
from procmesh_orchestrator.processors.catalog import SidecarCatalog
from procmesh_orchestrator.processors.lanes import ProcessorHandle, hook_names
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.run.hooks import LaneEntry
    from procmesh_orchestrator.run.types import Lanes

PHASES = {
    "process_input": "input",
    "process_input_step": "inputStep",
    "process_output_stream": "outputStream",
    "process_output_result": "outputResult",
    "process_output_step": "outputStep",
    "process_tool_result": "toolResult",
}
"""The reference's processor phases, by procmesh hook (the LLM and API-error hooks have none)."""

LANE_FIELDS = {"input": "inputProcessors", "output": "outputProcessors", "error": "errorProcessors"}
"""The lanes a call may replace, by the body's field names."""


@dataclass(frozen=True)
class Hosted:
    """A processor a sidecar hosts, under its catalog id."""

    id: str
    sidecar: str
    processor_id: str
    name: str
    description: str
    phases: list[str]


def hosted_processors(sidecars: SidecarCatalog) -> dict[str, Hosted]:
    """Every processor the sidecars host (``Describe``), by id (``sidecar:id`` when two share an id)."""
    counts: dict[str, int] = {}
    for infos in sidecars.processors.values():
        for pid in infos:
            counts[pid] = counts.get(pid, 0) + 1
    out: dict[str, Hosted] = {}
    for sidecar, infos in sorted(sidecars.processors.items()):
        for pid, info in infos.items():
            key = pid if counts[pid] == 1 else f"{sidecar}:{pid}"
            hooks = [PHASES[h] for h in PHASES if h in hook_names(info.hooks)]
            out[key] = Hosted(key, sidecar, pid, info.name or pid, info.description, hooks)
    return out


def find_hosted(hosted: dict[str, Hosted], processor_id: str) -> Hosted | None:
    """The processor `processor_id` names (``sidecar:id`` always names one)."""
    found = hosted.get(processor_id)
    if found is None:
        sidecar, _, pid = processor_id.partition(":")
        found = next((h for h in hosted.values() if h.sidecar == sidecar and h.processor_id == pid), None)
    return found


def handle(binder: LaneBinder, hosted: Hosted, lanes: Lanes | None) -> ProcessorHandle:
    """The processor bound as an agent's `lanes` have it (its options), else with no options."""
    if lanes is not None:
        for item in lanes.every():
            if (
                isinstance(item, ProcessorHandle)
                and item.client is binder.sidecars.clients.get(hosted.sidecar)
                and (item.hosted_id or item.processor_id) == hosted.processor_id
            ):
                return item
    return binder.resolve([f"{hosted.sidecar}/{hosted.processor_id}"], "processors")[0]


def bind(
    binder: LaneBinder, lanes: Lanes | None, names: Mapping[str, Sequence[str]]
) -> dict[str, list[LaneEntry]]:
    """`names` (by lane) bound to the processors and workflows `binder` knows, each processor as
    the agent's `lanes` have it; ConfigError naming the entry (``outputProcessors.0``) that names
    nothing here or cannot be bound."""
    hosted = hosted_processors(binder.sidecars)
    workflows = binder.workflows
    bound: dict[str, list[LaneEntry]] = {}
    for kind, ids in names.items():
        entries: list[LaneEntry] = []
        for i, pid in enumerate(ids):
            where = f"{LANE_FIELDS[kind]}.{i}"
            found = find_hosted(hosted, pid)
            workflow = pid.removeprefix("workflow:")
            if found is not None:
                entries.append(handle(binder, found, lanes))
            elif workflow in workflows and kind == "error":
                raise ConfigError(f"{where}: the error lane takes processors, not the workflow {label(pid)}")
            elif workflow in workflows:
                entries.extend(binder.resolve_lane([f"workflow:{workflow}"], where))
            else:
                known = sorted(hosted) + (sorted(workflows) if kind != "error" else [])
                raise ConfigError(f"{where}: unknown processor {label(pid)} (known: {', '.join(known)})")
        bound[kind] = entries
    return bound
