"""The HTTP room's ASGI app: one route table over the route modules, the error handlers, and the
boundary around it."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from procmesh_orchestrator.service._errors import ServiceError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.agents import AgentRoutes
from procmesh_orchestrator.service.http.bodies import error_response, read_body
from procmesh_orchestrator.service.http.boundary import Boundary
from procmesh_orchestrator.service.http.catalog import CatalogRoutes
from procmesh_orchestrator.service.http.decisions import DecisionRoutes
from procmesh_orchestrator.service.http.mcp import McpRoutes
from procmesh_orchestrator.service.http.memory import MemoryRoutes
from procmesh_orchestrator.service.http.memory_search import MemorySearchRoutes
from procmesh_orchestrator.service.http.probes import ProbeRoutes
from procmesh_orchestrator.service.http.replays import ReplayRoutes
from procmesh_orchestrator.service.http.runs import RunRoutes
from procmesh_orchestrator.service.http.unsupported import unsupported_routes
from procmesh_orchestrator.service.http.working_memory import WorkingMemoryRoutes


def build_http_app(core: ServiceCore) -> ASGIApp:
    """The ASGI app of the HTTP API, bound to the service's core."""

    async def read_json(request: Request) -> Any:
        return await read_body(core, request)

    app = Starlette(
        routes=[
            *CatalogRoutes(core, read_json).routes(),  # first: /api/agents/providers, agent details
            *AgentRoutes(core).routes(),
            *DecisionRoutes(core).routes(),  # before /api/runs/{run_id}: /api/runs/decisions is its own
            *RunRoutes(core).routes(),
            *ReplayRoutes(core, read_json).routes(),
            *ProbeRoutes(core).routes(),
            *MemoryRoutes(core, read_json).routes(),
            *WorkingMemoryRoutes(core, read_json).routes(),
            *MemorySearchRoutes(core, read_json).routes(),
            *McpRoutes(core).routes(),
            *unsupported_routes(core),  # last: the 501s never shadow a route served above
        ],
        exception_handlers={
            ServiceError: _on_service_error,
            HTTPException: _on_http_error,
            Exception: _on_unexpected,
        },
    )
    return Boundary(app, core)


async def _on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc.http_status, str(exc))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    return error_response(500, "internal error")  # Boundary logs it
