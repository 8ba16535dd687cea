"""The catalog HTTP API that @mastra/client-js 1.47 calls: ``agent.details()``, ``getTool``/
``executeTool``, ``listTools``/``getTool(id).details()/execute()``, ``listProcessors``/
``getProcessor(id).details()/execute()`` (a processor workflow's too), ``listWorkflows``/
``getWorkflow(id).details()`` and ``listAgentsModelProviders``. The shapes and running a tool are
`api.catalog`'s, the sidecars' processors `api.processors`' (running a phase
`api.processor_execute`'s); the client's routes procmesh cannot serve are `unsupported`'s 501s.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.tools import Tool
from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service._errors import BadRequestError, CatalogNotFoundError
from procmesh_orchestrator.service._limits import check_input
from procmesh_orchestrator.service.api import catalog
from procmesh_orchestrator.service.api.calls import RUN_ID_PATTERN
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.processor_execute import check_body, execute_phase
from procmesh_orchestrator.service.api.processors import (
    find_processor,
    hosted_processors,
    processor_json,
    workflow_processor_json,
)
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.service.http.bodies import refuse_unknown, route
from procmesh_orchestrator.service.http.unsupported import WORKFLOW_RUNS, not_supported
from procmesh_orchestrator.store import label

ReadJson = Callable[[Request], Awaitable[Any]]


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


class CatalogRoutes:
    """The served catalog routes; they go before ``/api/agents/{agent_id}`` (``/agents/providers``)."""

    def __init__(self, core: ServiceCore, read_json: ReadJson) -> None:
        self.core = core
        self._read_json = read_json

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        return [
            route("/api/agents", self.list_agents, "GET", _CONTEXT, "partial"),
            route("/api/agents/providers", self.list_providers, "GET"),
            route("/api/agents/{agent_id}", self.get_agent, "GET", _CONTEXT),
            route("/api/agents/{agent_id}/tools/{tool_id}", self.get_agent_tool, "GET", _CONTEXT),
            route("/api/agents/{agent_id}/tools/{tool_id}/execute", self.execute_agent_tool, "POST"),
            route("/api/tools", self.list_tools, "GET", _CONTEXT),
            route("/api/tools/{tool_id}", self.get_tool, "GET", _CONTEXT),
            route("/api/tools/{tool_id}/execute", self.execute_tool, "POST", "runId"),
            route("/api/processors", self.list_processors, "GET", _CONTEXT),
            route("/api/processors/{processor_id}", self.get_processor, "GET", _CONTEXT),
            route("/api/processors/{processor_id}/execute", self.execute_processor, "POST"),
            route("/api/workflows", self.list_workflows, "GET", _CONTEXT, "partial"),
            # before /api/workflows/{workflow_id}, which would take it for a workflow's id
            Route(
                "/api/workflows/run-counts",
                not_supported(self.core, "workflow run counts", WORKFLOW_RUNS),
                methods=["GET"],
            ),
            route("/api/workflows/{workflow_id}", self.get_workflow, "GET", _CONTEXT),
        ]

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        check_input(body, self.core.limits)
        return body

    def _request_context(self, request: Request, body: dict[str, Any]) -> dict[str, Any]:
        """The body's requestContext, as far as the caller is trusted for it (as generate: a 400
        naming the keys it may not send)."""
        return self.core.trust.check(caller_of(request), body.get("requestContext"))

    async def _execute(self, request: Request, agent_id: str, tool: Tool) -> Response:
        body = await self._body(request)
        refuse_unknown(body, ("data", "requestContext"), "a tool's execute body is {data, requestContext?}")
        data = body.get("data")
        catalog.check_tool_call(tool, data)
        options = CallOptions(
            request_context=self._request_context(request, body),
            resource_id=caller_of(request).resource or "",
            run_id=_run_id(request),
        )
        return _json(await catalog.run_tool(self.core, agent_id, tool, data, options))

    async def list_agents(self, request: Request) -> Response:
        """``GET /api/agents``: every agent's details by id."""
        core = self.core
        return _json({agent_id: catalog.agent_json(core, agent_id) for agent_id in core.app.agents})

    async def get_agent(self, request: Request) -> Response:
        """``GET /api/agents/{agent_id}``: the agent's details."""
        agent_id = request.path_params["agent_id"]
        self.core.agent(agent_id)
        return _json(catalog.agent_json(self.core, agent_id))

    async def list_providers(self, request: Request) -> Response:
        """``GET /api/agents/providers``: the model providers."""
        return _json({"providers": catalog.providers_json(self.core)})

    async def get_agent_tool(self, request: Request) -> Response:
        """``GET /api/agents/{agent_id}/tools/{tool_id}``."""
        tool_id = request.path_params["tool_id"]
        tool = catalog.agent_tool(self.core, request.path_params["agent_id"], tool_id)
        return _json(catalog.tool_json(tool_id, tool))

    async def execute_agent_tool(self, request: Request) -> Response:
        """``POST /api/agents/{agent_id}/tools/{tool_id}/execute``."""
        agent_id = request.path_params["agent_id"]
        tool = catalog.agent_tool(self.core, agent_id, request.path_params["tool_id"])
        return await self._execute(request, agent_id, tool)

    async def list_tools(self, request: Request) -> Response:
        """``GET /api/tools``: every agent's tools by name."""
        tools = catalog.all_tools(self.core)
        return _json({name: catalog.tool_json(name, tool) for name, (_, tool) in tools.items()})

    async def get_tool(self, request: Request) -> Response:
        """``GET /api/tools/{tool_id}``."""
        tool_id = request.path_params["tool_id"]
        return _json(catalog.tool_json(tool_id, catalog.any_tool(self.core, tool_id)[1]))

    async def execute_tool(self, request: Request) -> Response:
        """``POST /api/tools/{tool_id}/execute``: as the first agent that has the tool."""
        agent_id, tool = catalog.any_tool(self.core, request.path_params["tool_id"])
        return await self._execute(request, agent_id, tool)

    async def list_processors(self, request: Request) -> Response:
        """``GET /api/processors``: the sidecars' processors and the processor workflows."""
        core = self.core
        body = {h.id: processor_json(core, h, listing=True) for h in hosted_processors(core).values()}
        for name in core.app.config.workflows:
            body.setdefault(name, workflow_processor_json(core, name, listing=True))
        return _json(body)

    async def get_processor(self, request: Request) -> Response:
        """``GET /api/processors/{processor_id}``."""
        core = self.core
        processor_id = request.path_params["processor_id"]
        if processor_id in core.app.config.workflows and processor_id not in hosted_processors(core):
            return _json(workflow_processor_json(core, processor_id, listing=False))
        return _json(processor_json(core, find_processor(core, processor_id), listing=False))

    async def execute_processor(self, request: Request) -> Response:
        """``POST /api/processors/{processor_id}/execute``: one phase of a processor or processor
        workflow on the body's messages."""
        body = await self._body(request)
        check_body(body)  # before the request context is read: an unknown key is the first error
        resource = caller_of(request).resource or ""
        answer = await execute_phase(
            self.core,
            request.path_params["processor_id"],
            body,
            self._request_context(request, body),
            resource,
        )
        return _json(answer)

    async def list_workflows(self, request: Request) -> Response:
        """``GET /api/workflows``: the processor workflows."""
        workflows = self.core.app.config.workflows
        return _json({name: catalog.workflow_json(self.core, name) for name in workflows})

    async def get_workflow(self, request: Request) -> Response:
        """``GET /api/workflows/{workflow_id}``."""
        name = request.path_params["workflow_id"]
        workflows = self.core.app.config.workflows
        if name not in workflows:
            raise CatalogNotFoundError(
                f"no workflow {label(name)} (processor workflows: {sorted(workflows)})"
            )
        return _json(catalog.workflow_json(self.core, name))


_CONTEXT = "requestContext"
"""What @mastra/client-js adds to a catalog read: checked (base64 JSON) and not used, since no
catalog answer of procmesh's depends on the request context (its agents are configured, not
resolved per call); ``partial`` (the reference's lighter listing) is answered in full."""


def _run_id(request: Request) -> str | None:
    """``POST /api/tools/{id}/execute?runId=``: the run id the tool's context gets (client-js's
    ``getTool(id).execute({runId})``), under the rule for a caller's run id."""
    run_id = request.query_params.get("runId")
    if run_id is None:
        return None
    if not re.fullmatch(RUN_ID_PATTERN, run_id) or len(run_id) > 128:
        raise BadRequestError("runId: letters, digits and ._:- (at most 128 characters)")
    return run_id
