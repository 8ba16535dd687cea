"""The catalog HTTP API that @mastra/client-js 1.47 calls: agent details, tools, processors,
processor workflows and model providers, with the reference server's shapes.

``catalog_routes`` serves what maps onto procmesh: ``agent.details()``, ``getTool``/``executeTool``,
``listTools``/``getTool(id).details()/execute()``, ``listProcessors``/``getProcessor(id).details()/
execute()`` (`api.processors`: sidecar processors from ``Describe``), ``listWorkflows``/``getWorkflow(id)
.details()`` (the configured processor workflows) and ``listAgentsModelProviders``.
``unsupported_routes`` answers every other route of those client APIs with 501 and a message that
names the feature and why (`UNSUPPORTED`, the table docs/service.md shows), never 404. Its routes
go last in the route table, so a route another part of the API serves later takes precedence.

Schemas are sent as the client expects them: strings of superjson-shaped JSON (``{"json": schema}``),
which the client's ``parseSuperJsonString`` unwraps.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.config.lanes import TryStep
from procmesh_orchestrator.config.schema import (
    DEFAULT_PROVIDERS,
    ConditionalStep,
    ParallelStep,
    ProcessorRef,
    WorkflowRef,
    workflow_refs,
)
from procmesh_orchestrator.errors import ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.tools import Tool, ToolCall, invalid_args
from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    CatalogNotFoundError,
    NotSupportedError,
    ServiceError,
)
from procmesh_orchestrator.service._limits import check_input
from procmesh_orchestrator.service.api.processors import (
    execute_phase,
    find_processor,
    hosted_processors,
    processor_json,
    workflow_processor_json,
)
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.config.schema import AgentConfig, Config
    from procmesh_orchestrator.service.api.core import ServiceCore

ReadJson = Callable[[Request], Awaitable[Any]]

BUILTIN_MODEL_PROVIDERS = ("demo", "scripted")


class ToolRefusedError(ServiceError):
    """A tool that needs approval runs only inside a run, where the approval can be given."""

    http_status = 409


class ToolFailedError(ServiceError):
    """The tool ran and failed (its error, as the model would have seen it)."""

    http_status = 500


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


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


# -- routes --------------------------------------------------------------------------------


def catalog_routes(service: ServiceCore, read_json: ReadJson) -> list[Route]:
    """The served catalog routes; they go before ``/api/agents/{agent_id}`` (``/agents/providers``)."""

    async def body_of(request: Request) -> dict[str, Any]:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        check_input(body, service.limits)
        return body

    def request_context(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        """The body's requestContext, as far as the caller is trusted for it (as generate: a 400
        naming the keys it may not send)."""
        return service.trust.check(caller_of(request), body.get("requestContext"))

    def all_tools() -> dict[str, tuple[str, Tool]]:
        """Every agent's tools by name, with the first agent that has each (runs it)."""
        out: dict[str, tuple[str, Tool]] = {}
        for agent_id, agent in service.app.agents.items():
            for name, tool in agent.spec.tools.items():
                out.setdefault(name, (agent_id, tool))
        return out

    def agent_tool(agent_id: str, tool_id: str) -> Tool:
        tool = service.agent(agent_id).spec.tools.get(tool_id)
        if tool is None:
            raise CatalogNotFoundError(f"agent {label(agent_id)} has no tool {label(tool_id)}")
        return tool

    def any_tool(tool_id: str) -> tuple[str, Tool]:
        found = all_tools().get(tool_id)
        if found is None:
            raise CatalogNotFoundError(f"no tool {label(tool_id)}")
        return found

    async def execute(request: Request, agent_id: str, tool: Tool) -> Response:
        body = await body_of(request)
        data = body.get("data")
        if tool.requires_approval:
            raise ToolRefusedError(
                f"tool {tool.name!r} needs approval: it runs only inside a run (approveToolCall)"
            )
        problem = invalid_args(tool, data)
        if problem is not None:
            raise BadRequestError(problem)
        options = CallOptions(
            request_context=request_context(request, body),
            resource_id=caller_of(request).resource or "",
        )
        # The run's one tool path: a run with no input, so a sidecar's tool gets its usual context.
        run = RunCore(service.agent(agent_id).spec, [], options, sink=None, metrics=service.app.metrics)
        call = ToolCall(str(uuid.uuid4()), tool.name, data)

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
        return _json(outcome.result)

    async def list_agents(request: Request) -> Response:
        return _json({agent_id: agent_json(service, agent_id) for agent_id in service.app.agents})

    async def get_agent(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        service.agent(agent_id)
        return _json(agent_json(service, agent_id))

    async def list_providers(request: Request) -> Response:
        return _json({"providers": providers_json(service)})

    async def get_agent_tool(request: Request) -> Response:
        tool_id = request.path_params["tool_id"]
        return _json(tool_json(tool_id, agent_tool(request.path_params["agent_id"], tool_id)))

    async def execute_agent_tool(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        return await execute(request, agent_id, agent_tool(agent_id, request.path_params["tool_id"]))

    async def list_tools(request: Request) -> Response:
        return _json({name: tool_json(name, tool) for name, (_, tool) in all_tools().items()})

    async def get_tool(request: Request) -> Response:
        tool_id = request.path_params["tool_id"]
        return _json(tool_json(tool_id, any_tool(tool_id)[1]))

    async def execute_tool(request: Request) -> Response:
        agent_id, tool = any_tool(request.path_params["tool_id"])
        return await execute(request, agent_id, tool)

    async def list_processors(request: Request) -> Response:
        body = {h.id: processor_json(service, h, listing=True) for h in hosted_processors(service).values()}
        for name in service.app.config.workflows:
            body.setdefault(name, workflow_processor_json(service, name, listing=True))
        return _json(body)

    async def get_processor(request: Request) -> Response:
        processor_id = request.path_params["processor_id"]
        if processor_id in service.app.config.workflows and processor_id not in hosted_processors(service):
            return _json(workflow_processor_json(service, processor_id, listing=False))
        return _json(processor_json(service, find_processor(service, processor_id), listing=False))

    async def execute_processor(request: Request) -> Response:
        body = await body_of(request)
        resource = caller_of(request).resource or ""
        answer = await execute_phase(
            service, request.path_params["processor_id"], body, request_context(request, body), resource
        )
        return _json(answer)

    async def list_workflows(request: Request) -> Response:
        return _json({name: workflow_json(service, name) for name in service.app.config.workflows})

    async def get_workflow(request: Request) -> Response:
        name = request.path_params["workflow_id"]
        if name not in service.app.config.workflows:
            raise CatalogNotFoundError(
                f"no workflow {label(name)} (processor workflows: {sorted(service.app.config.workflows)})"
            )
        return _json(workflow_json(service, name))

    return [
        Route("/api/agents", list_agents, methods=["GET"]),
        Route("/api/agents/providers", list_providers, methods=["GET"]),
        Route("/api/agents/{agent_id}", get_agent, methods=["GET"]),
        Route("/api/agents/{agent_id}/tools/{tool_id}", get_agent_tool, methods=["GET"]),
        Route("/api/agents/{agent_id}/tools/{tool_id}/execute", execute_agent_tool, methods=["POST"]),
        Route("/api/tools", list_tools, methods=["GET"]),
        Route("/api/tools/{tool_id}", get_tool, methods=["GET"]),
        Route("/api/tools/{tool_id}/execute", execute_tool, methods=["POST"]),
        Route("/api/processors", list_processors, methods=["GET"]),
        Route("/api/processors/{processor_id}", get_processor, methods=["GET"]),
        Route("/api/processors/{processor_id}/execute", execute_processor, methods=["POST"]),
        Route("/api/workflows", list_workflows, methods=["GET"]),
        # before /api/workflows/{workflow_id}, which would take it for a workflow's id
        Route(
            "/api/workflows/run-counts",
            _not_supported(service, "workflow run counts", _WORKFLOW_RUNS),
            methods=["GET"],
        ),
        Route("/api/workflows/{workflow_id}", get_workflow, methods=["GET"]),
    ]


# -- what procmesh cannot support ----------------------------------------------------------

_WORKFLOW_RUNS = "procmesh runs processor workflows inside agents only"
_VOICE = "procmesh agents have no voice provider"
_MODEL = "an agent's model is fixed by the configuration (change it there and roll out)"
_NETWORK = "procmesh agents have no sub-agents to route between"
_SIGNALS = "procmesh runs are request-scoped: there is no long-lived agent thread to message"
_LEGACY = "procmesh serves the current routes only (use /generate and /stream)"
_EDITOR = "procmesh agents are configured in files, not edited at runtime"
_RECOVER = "a durable run is taken over by another replica by itself; reattach with observe"
_RESUME = "decide a suspended tool call with approveToolCall or declineToolCall"
_PROVIDERS = "procmesh tools and processors come from sidecars and MCP servers in the configuration"

UNSUPPORTED: tuple[tuple[str, str, str, str], ...] = (
    ("POST", "/agents/{agent_id}/generate-legacy", "the legacy generate route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream-legacy", "the legacy stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/generate/vnext", "the vNext generate route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/vnext", "the vNext stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/streamVNext", "the vNext stream route", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/ui", "AI SDK UI message streams", _LEGACY),
    ("POST", "/agents/{agent_id}/stream/vnext/ui", "AI SDK UI message streams", _LEGACY),
    ("POST", "/agents/{agent_id}/network", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/approve-network-tool-call", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/decline-network-tool-call", "agent networks", _NETWORK),
    ("POST", "/agents/{agent_id}/send-message", "agent messages", _SIGNALS),
    ("POST", "/agents/{agent_id}/queue-message", "agent messages", _SIGNALS),
    ("POST", "/agents/{agent_id}/signals", "agent signals", _SIGNALS),
    ("POST", "/agents/{agent_id}/threads/subscribe", "thread subscriptions", _SIGNALS),
    ("POST", "/agents/{agent_id}/threads/abort", "aborting a thread's run", _SIGNALS),
    ("POST", "/agents/{agent_id}/stream-until-idle", "streaming until a thread is idle", _SIGNALS),
    ("POST", "/agents/{agent_id}/resume-stream-until-idle", "streaming until a thread is idle", _SIGNALS),
    ("POST", "/agents/{agent_id}/recover", "recovering a run", _RECOVER),
    ("POST", "/agents/{agent_id}/resume-stream", "resuming a suspended stream", _RESUME),
    ("POST", "/agents/{agent_id}/send-tool-approval", "tool approval by message", _RESUME),
    ("POST", "/agents/{agent_id}/model", "changing an agent's model", _MODEL),
    ("POST", "/agents/{agent_id}/model/reset", "changing an agent's model", _MODEL),
    ("POST", "/agents/{agent_id}/models/reorder", "model lists", _MODEL),
    ("POST", "/agents/{agent_id}/models/{model_config_id}", "model lists", _MODEL),
    ("POST", "/agents/{agent_id}/clone", "cloning an agent", _EDITOR),
    # the Agent resource's version methods (listVersions, ...) call the stored-agents routes
    ("GET", "/stored/agents/{agent_id}/versions", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions", "agent versions", _EDITOR),
    ("GET", "/stored/agents/{agent_id}/versions/compare", "agent versions", _EDITOR),
    ("GET", "/stored/agents/{agent_id}/versions/{version_id}", "agent versions", _EDITOR),
    ("DELETE", "/stored/agents/{agent_id}/versions/{version_id}", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions/{version_id}/activate", "agent versions", _EDITOR),
    ("POST", "/stored/agents/{agent_id}/versions/{version_id}/restore", "agent versions", _EDITOR),
    ("POST", "/agents/{agent_id}/instructions/enhance", "enhancing instructions", _EDITOR),
    ("GET", "/agents/{agent_id}/plans/file", "agent plans", "procmesh agents have no workspace"),
    ("GET", "/agents/{agent_id}/skills/{skill_name}", "agent skills", "procmesh agents have no workspace"),
    ("GET", "/agents/{agent_id}/browser/session", "browser sessions", "procmesh agents have no browser"),
    ("POST", "/agents/{agent_id}/browser/close", "browser sessions", "procmesh agents have no browser"),
    ("POST", "/agents/{agent_id}/voice/speak", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/voice/listen", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/voice/speakers", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/voice/listener", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/speak", "voice", _VOICE),
    ("POST", "/agents/{agent_id}/listen", "voice", _VOICE),
    ("GET", "/agents/{agent_id}/speakers", "voice", _VOICE),
    ("POST", "/workflows/events", "workflow events", _WORKFLOW_RUNS),
    ("GET", "/workflows/{workflow_id}/runs", "workflow runs", _WORKFLOW_RUNS),
    ("GET", "/workflows/{workflow_id}/runs/{run_id}", "workflow runs", _WORKFLOW_RUNS),
    ("DELETE", "/workflows/{workflow_id}/runs/{run_id}", "workflow runs", _WORKFLOW_RUNS),
    ("POST", "/workflows/{workflow_id}/runs/{run_id}/cancel", "workflow runs", _WORKFLOW_RUNS),
    ("POST", "/workflows/{workflow_id}/runs/{run_id}/steps/execute", "workflow runs", _WORKFLOW_RUNS),
    *(
        ("POST", f"/workflows/{{workflow_id}}/{action}", "workflow runs", _WORKFLOW_RUNS)
        for action in (
            "create-run",
            "start",
            "start-async",
            "stream",
            "stream-legacy",
            "observe",
            "observe-stream-legacy",
            "resume",
            "resume-async",
            "resume-stream",
            "resume-no-wait",
            "restart",
            "restart-async",
            "restart-all-active-workflow-runs",
            "restart-all-active-workflow-runs-async",
            "time-travel",
            "time-travel-async",
            "time-travel-stream",
        )
    ),
    ("GET", "/processor-providers", "processor providers", _PROVIDERS),
    ("GET", "/processor-providers/{provider_id}", "processor providers", _PROVIDERS),
    ("GET", "/tool-providers", "tool providers", _PROVIDERS),
    *(
        ("GET", f"/tool-providers/{{provider_id}}/{rest}", "tool providers", _PROVIDERS)
        for rest in (
            "toolkits",
            "tools",
            "tools/{tool_slug}/schema",
            "health",
            "connection-fields",
            "connections",
            "connections/{connection_id}/usage",
            "auth-status/{auth_id}",
        )
    ),
    ("POST", "/tool-providers/{provider_id}/authorize", "tool providers", _PROVIDERS),
    ("POST", "/tool-providers/{provider_id}/connection-status", "tool providers", _PROVIDERS),
    ("PATCH", "/tool-providers/{provider_id}/connections/{connection_id}", "tool providers", _PROVIDERS),
    ("DELETE", "/tool-providers/{provider_id}/connections/{connection_id}", "tool providers", _PROVIDERS),
)
"""(method, path under /api, feature, why) of every route of the client's agent, tool, processor,
workflow-listing and model-provider APIs that procmesh answers with 501."""


def _not_supported(service: ServiceCore, feature: str, why: str) -> Callable[[Request], Awaitable[Response]]:
    async def not_supported(request: Request) -> Response:
        agent_id = request.path_params.get("agent_id")
        if agent_id is not None:
            service.agent(agent_id)  # an unknown agent is still a 404, as everywhere
        raise NotSupportedError(f"{feature} is not supported by procmesh: {why}")

    return not_supported


def unsupported_routes(service: ServiceCore) -> list[Route]:
    """A 501 naming the feature for each `UNSUPPORTED` route; they go last in the route table."""
    return [
        Route(f"/api{path}", _not_supported(service, feature, why), methods=[method])
        for method, path, feature, why in UNSUPPORTED
    ]
