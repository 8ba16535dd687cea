"""What the model gateway serves, to whom, and what its metrics and logs may say of a call.

- **Who**: a caller on the orchestrator's unix socket (``--grpc-socket``: the pod's sidecars; the
  socket file's permissions are the boundary), and on the TCP port a key with the ``gateway`` or
  ``operator`` role. With no API keys configured (open development mode) every caller is served,
  as the rest of the API is.
- **Which models**: only those the config names (`GatewayModels`): a ``models`` key, a ``prices``
  key, an agent's model (its fallbacks included), and a processor option naming a model (``model``,
  or a key ending in ``_model`` or ``Model``, at any depth of ``options``; a ``fromContext`` option
  names its default and cases), in an agent's lanes
  (those chosen from the request context included) or a workflow. Any other reference is refused
  before any provider is asked.
- **Labels**: a metric label is never caller text: a model or processor the config does not name
  is counted as ``other``, an absent processor id as ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from procmesh_orchestrator.config import AgentConfig, Config, ProcessorRef, WorkflowRef, workflow_refs
from procmesh_orchestrator.config.lanes import option_models, workflow_processors
from procmesh_orchestrator.service._auth import GATEWAY, OPERATOR

OTHER = "other"
"""The label of every model or processor name the config does not know."""
UNKNOWN = "unknown"
"""The processor label of a call that names no processor."""
GATEWAY_ROLES = frozenset({GATEWAY, OPERATOR})
"""A key with one of these roles may call the gateway over TCP."""
MAX_SHOWN = 64
"""Characters of a caller's text kept where a log line or an error names it (escaped with repr)."""


def shown(value: str) -> str:
    """Caller text as a log line or an error may show it: cut, quoted, every control character escaped."""
    return repr(value[:MAX_SHOWN] + ("..." if len(value) > MAX_SHOWN else ""))


def on_local_socket(peer: str) -> bool:
    """True for a gRPC peer connected over a unix socket (grpc reports ``unix:...``)."""
    return peer.startswith("unix:")


def _agent_refs(config: Config, agent: AgentConfig) -> Iterator[ProcessorRef]:
    for _, lane in agent.named_lanes():
        for entry in lane:
            if isinstance(entry, WorkflowRef):
                yield from (ref for _, ref in workflow_processors(entry.workflow, config.workflows, ""))
            else:
                yield entry


@dataclass(frozen=True)
class GatewayModels:
    """The models the config names, which agents name each one, and the processor names it knows."""

    agents_of: Mapping[str, tuple[str, ...]]
    """Model reference -> the agents whose config names it (their models or their processors'
    options); a reference only ``models`` or ``prices`` names has no agent."""
    processors: frozenset[str]
    """Every processor id, ``sidecar/processor-id`` and instance name in the config."""

    @classmethod
    def of(cls, config: Config) -> GatewayModels:
        """What `config` names."""
        agents_of: dict[str, list[str]] = {ref: [] for ref in (*config.models, *config.prices)}
        processors: set[str] = set()
        refs: list[ProcessorRef] = [
            r for w in config.workflows.values() for s in w.steps for r in workflow_refs(s)
        ]
        for ref in refs:
            for model in option_models(ref.options):
                agents_of.setdefault(model, [])
        for agent_id, agent in config.agents.items():
            named = [choice.model for choice in agent.models]
            for ref in _agent_refs(config, agent):
                refs.append(ref)
                named.extend(option_models(ref.options))
            for model in named:
                owners = agents_of.setdefault(model, [])
                if agent_id not in owners:
                    owners.append(agent_id)
        for ref in refs:
            processors.update((ref.processor, ref.processor_id, ref.instance))
        return cls({k: tuple(v) for k, v in agents_of.items()}, frozenset(processors))

    def knows(self, model: str) -> bool:
        """True when the config names `model`."""
        return model in self.agents_of

    def model_label(self, model: str) -> str:
        """`model` when the config names it, else ``other``."""
        return model if model in self.agents_of else OTHER

    def processor_label(self, processor_id: str) -> str:
        """`processor_id` when the config names it, ``unknown`` when empty, else ``other``."""
        if not processor_id:
            return UNKNOWN
        return processor_id if processor_id in self.processors else OTHER
