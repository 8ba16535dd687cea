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

`access_check` is the who, run by the gRPC server's interceptor before a request is decoded;
`caller_resource` the same rule inside the servicer, giving the resource the caller's key is
bound to (cost control's scope, and the tenant a verdict is cached and merged under).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from procmesh_orchestrator.config import AgentConfig, Config, ProcessorRef, WorkflowRef, workflow_refs
from procmesh_orchestrator.config.lanes import option_models, workflow_processors
from procmesh_orchestrator.service._auth import GATEWAY, OPERATOR, grpc_caller
from procmesh_orchestrator.service._errors import ServiceError
from procmesh_orchestrator.service.grpc.judge_sections import Refused

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

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


class Children:
    """Metrics' children by label values, each looked up once: prometheus_client's ``labels()``
    takes a lock and checks its values on every call, and the gateway counts several series per
    call (labels are config names or ``other``/``unknown``: a bounded set)."""

    def __init__(self) -> None:
        self._of: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *labels: str) -> Any:
        """`metric`'s child for `labels` (``metric.labels(*labels)``)."""
        key = (metric, labels)
        child = self._of.get(key)
        if child is None:
            child = self._of[key] = metric.labels(*labels)
        return child


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


def caller_resource(service: ServiceCore, context: Context) -> str | None:
    """Let the caller in (`Refused` otherwise); the resource its key is bound to, if any.

    On the unix socket any caller is served (a key it sends is still checked); on the TCP port a
    key with the ``gateway`` or ``operator`` role; with no keys configured, every caller."""
    keys = service.keys
    if not keys.enabled:
        return None
    local = on_local_socket(context.peer() or "")
    if local and not any(k == "authorization" for k, _ in context.invocation_metadata() or ()):
        return None
    try:
        caller = grpc_caller(keys, context)
    except ServiceError as exc:
        raise Refused(exc.grpc_code, "unauthenticated", str(exc)) from None
    if not local and not caller.roles & GATEWAY_ROLES:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            "permission_denied",
            "the model gateway serves sidecars only: on the gRPC port it needs a key with the 'gateway' "
            "role (an entry KEY=@gateway in PROCMESH_API_KEYS) or the 'operator' role; a sidecar in the "
            "pod may call it over the orchestrator's unix socket (--grpc-socket) instead",
        )
    return caller.resource


def access_check(service: ServiceCore) -> Callable[[Context], Awaitable[None]]:
    """The check the gRPC server runs before it decodes a ModelService request, so a caller the
    gateway refuses learns nothing about decoding; counted with the labels ``unknown`` (the
    request is not read) and logged in one line."""

    async def check(context: Context) -> None:
        try:
            caller_resource(service, context)
        except Refused as exc:
            service.app.metrics.gateway_calls.labels(UNKNOWN, UNKNOWN, exc.outcome).inc()
            log.info("model gateway refused a caller at %s: %s", shown(context.peer() or ""), exc.outcome)
            await context.abort(exc.code, str(exc))

    return check
