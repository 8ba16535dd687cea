"""The catalog @mastra/client-js reads, whatever serves it: agents' details, tools (and running one
outside a run), processor workflows and model providers, in the reference server's shapes.

Schemas are sent as the client expects them: strings of superjson-shaped JSON (``{"json": schema}``),
which the client's ``parseSuperJsonString`` unwraps. The sidecars' processors are `api.processors`'.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.config.lanes import (
    ConditionalStep,
    ParallelStep,
    ProcessorRef,
    TryStep,
    WorkflowRef,
    workflow_refs,
)
from procmesh_orchestrator.config.providers import DEFAULT_PROVIDERS
from procmesh_orchestrator.errors import ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.background import BackgroundTool
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.tools import Tool, ToolCall, invalid_args
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    CatalogNotFoundError,
    NotSupportedError,
    ServiceError,
)
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.config.agents import AgentConfig
    from procmesh_orchestrator.config.schema import Config
    from procmesh_orchestrator.service.api.core import ServiceCore

BUILTIN_MODEL_PROVIDERS = ("demo", "scripted")


class ToolRefusedError(ServiceError):
    """A tool that needs approval runs only inside a run, where the approval can be given."""

    http_status = 409


class ToolFailedError(ServiceError):
    """The tool ran and failed (its error, as the model would have seen it)."""

    http_status = 500


def schema_string(schema: dict[str, Any] | None) -> str | None:
    """A JSON schema as the reference sends it: a string of superjson's ``{"json": ...}``."""
    return json.dumps({"json": schema}, ensure_ascii=False) if schema else None


def tool_json(name: str, tool: Tool) -> dict[str, Any]:
    """A tool as the reference returns it (``id``, ``description``, schemas as strings)."""
    body: dict[str, Any] = {"id": name, "description": tool.description}
    schema = schema_string(tool.input_schema)
    if schema is not None:
        body["inputSchema"] = schema
    if tool.requires_approval:
        body["requireApproval"] = True
    return body


def model_of(config: Config, reference: str) -> tuple[str, str]:
    """(provider, modelId) of an agent's ``model``: a ``models`` key, or ``provider/model-id``."""
    built_in = config.models.get(reference)
    if built_in is not None:
        return built_in.provider, reference
    provider, _, model_id = reference.partition("/")
    return provider, model_id


def _lane_json(entries: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, WorkflowRef):
            out.append({"id": entry.workflow, "name": f"workflow:{entry.workflow}"})
        elif isinstance(entry, ProcessorRef):
            out.append({"id": entry.instance, "name": entry.processor})
    return out


def agent_json(service: ServiceCore, agent_id: str) -> dict[str, Any]:
    """An agent as the reference's ``GET /agents/:agentId`` returns it (``Shared_Type_6``)."""
    config = service.app.config
    agent: AgentConfig = config.agents[agent_id]
    spec = service.app.agents[agent_id].spec
    provider, model_id = model_of(config, agent.model)
    options: dict[str, Any] = {"maxSteps": spec.max_steps}
    if spec.max_processor_retries is not None:
        options["maxProcessorRetries"] = spec.max_processor_retries
    return {
        "id": agent_id,
        "name": agent_id,
        "instructions": spec.instructions,
        "tools": {name: tool_json(name, tool) for name, tool in spec.tools.items()},
        "agents": {},
        "workflows": {},
        "skills": [],
        "workspaceTools": [],
        "browserTools": [],
        "hasBrowser": False,
        "inputProcessors": _lane_json(agent.possible_entries("input")),
        "outputProcessors": _lane_json(agent.possible_entries("output")),
        "provider": provider,
        "modelId": model_id,
        "modelVersion": "v2",
        "supportsMemory": agent.memory is not None,
        "defaultOptions": options,
        "source": "code",
    }


# -- model providers -----------------------------------------------------------------------


def providers_json(service: ServiceCore) -> list[dict[str, Any]]:
    """The configured model providers (and the built-in demo/scripted ones in use), with their models."""
    config = service.app.config
    used: dict[str, set[str]] = {}
    for agent in config.agents.values():
        provider, model_id = model_of(config, agent.model)
        used.setdefault(provider, set()).add(model_id)
    out = []
    for name, provider_config in sorted({**DEFAULT_PROVIDERS, **config.providers}.items()):
        env = provider_config.api_key_env
        out.append(
            {
                "id": name,
                "name": name,
                "label": f"{name} ({provider_config.kind} API at {provider_config.base_url})",
                "description": f"{provider_config.kind} wire format",
                "envVar": env or [],
                "connected": env is None or bool(os.environ.get(env)),
                "models": sorted(used.get(name, set())),
            }
        )
    for kind in BUILTIN_MODEL_PROVIDERS:
        models = sorted(key for key, m in config.models.items() if m.provider == kind)
        if models:
            out.append(
                {
                    "id": kind,
                    "name": kind,
                    "label": f"procmesh built-in {kind} model",
                    "envVar": [],
                    "connected": True,
                    "models": models,
                }
            )
    return out


# -- workflows -----------------------------------------------------------------------------


def workflow_json(service: ServiceCore, name: str) -> dict[str, Any]:
    """A processor workflow as the reference's ``GET /workflows/:id`` returns it (``Shared_Type_47``)."""
    workflow = service.app.config.workflows[name]
    steps: dict[str, dict[str, Any]] = {}
    graph: list[dict[str, Any]] = []

    def step(ref: ProcessorRef) -> dict[str, Any]:
        entry = {"id": ref.instance, "description": f"processor {ref.processor}", "component": "PROCESSOR"}
        steps[ref.instance] = entry
        return {"type": "step", "step": {"id": ref.instance, "description": entry["description"]}}

    for j, item in enumerate(workflow.steps):
        if isinstance(item, ParallelStep):
            graph.append(
                {"type": "parallel", "id": f"parallel-{j}", "steps": [step(r) for r in item.parallel]}
            )
        elif isinstance(item, ConditionalStep):
            branches = [step(r) for r in (*item.then, *item.otherwise)]
            graph.append(
                {
                    "type": "conditional",
                    "id": f"when-{j}",
                    "steps": branches,
                    "serializedConditions": [{"id": f"when-{j}", "fn": json.dumps(item.when)}],
                }
            )
        elif isinstance(item, TryStep):  # an error step: the catch is the branch its failure takes
            graph.append(
                {
                    "type": "conditional",
                    "id": f"try-{j}",
                    "steps": [step(r) for r in workflow_refs(item)],
                    "serializedConditions": [{"id": f"try-{j}", "fn": "catch when try fails"}],
                }
            )
        elif isinstance(item, WorkflowRef):  # a nested workflow, as the reference shows one
            graph.append({"type": "step", "step": {"id": item.workflow, "component": "WORKFLOW"}})
        else:
            graph.append(step(item))
    return {
        "name": name,
        "description": f"processor workflow {name!r} (runs inside agents' processor lanes)",
        "steps": steps,
        "allSteps": dict(steps),
        "stepGraph": graph,
        "isProcessorWorkflow": True,
        "origin": "code",
    }


# -- tools ------------------------------------------------------------------------------------


def all_tools(service: ServiceCore) -> dict[str, tuple[str, Tool]]:
    """Every agent's tools by name, with the first agent that has each (runs it)."""
    out: dict[str, tuple[str, Tool]] = {}
    for agent_id, agent in service.app.agents.items():
        for name, tool in agent.spec.tools.items():
            out.setdefault(name, (agent_id, tool))
    return out


def agent_tool(service: ServiceCore, agent_id: str, tool_id: str) -> Tool:
    """The agent's tool by this name (404 for an unknown agent or tool)."""
    tool = service.agent(agent_id).spec.tools.get(tool_id)
    if tool is None:
        raise CatalogNotFoundError(f"agent {label(agent_id)} has no tool {label(tool_id)}")
    return tool


def any_tool(service: ServiceCore, tool_id: str) -> tuple[str, Tool]:
    """The first agent that has a tool of this name, and the tool (404 when none has)."""
    found = all_tools(service).get(tool_id)
    if found is None:
        raise CatalogNotFoundError(f"no tool {label(tool_id)}")
    return found


def check_tool_call(tool: Tool, data: Any) -> None:
    """Whether the tool may run outside a run on these arguments: a tool that needs approval runs
    only inside a run (409); arguments its schema refuses are a 400 naming the fields."""
    if tool.requires_approval:
        raise ToolRefusedError(
            f"tool {tool.name!r} requires approval, which a direct execution would bypass: it runs "
            "only inside an agent run, where approveToolCall or declineToolCall decides each call"
        )
    problem = invalid_args(tool, data)
    if problem is not None:
        raise BadRequestError(problem)


async def run_tool(service: ServiceCore, agent_id: str, tool: Tool, data: Any, options: CallOptions) -> Any:
    """The tool's result, through the run's one tool path (`check_tool_call` first): a run with
    no input, so a sidecar's tool gets its usual context. Its failure is a ToolFailedError."""
    run = RunCore(service.agent(agent_id).spec, [], options, sink=None, metrics=service.app.metrics)
    call = ToolCall(str(uuid.uuid4()), tool.name, data)
    if isinstance(tool, BackgroundTool):  # background is a run's way to call it, as the reference's
        tool = tool.tool

    async def discard(chunk: dict[str, Any]) -> None:
        """A direct execution has no stream for the tool's data chunks."""

    try:
        outcome = await tool.execute(run, call, discard)
    except TripwireAbort as exc:
        raise ToolFailedError(f"tool {tool.name!r} aborted: {exc.reason}") from None
    except ProcessorFailedError as exc:
        raise ToolFailedError(f"tool {tool.name!r} failed: {exc}") from None
    if outcome is None:
        raise NotSupportedError(f"tool {tool.name!r} runs in the client")
    if outcome.error is not None:
        raise ToolFailedError(outcome.error)
    return outcome.result
