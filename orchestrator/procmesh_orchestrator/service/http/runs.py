"""Durable runs as a resource over HTTP: ``GET /api/runs`` (one page, within the caller's
resource), ``GET /api/runs/{run_id}`` and ``POST /api/runs/{run_id}/cancel``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service.api import control, durable
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import json_response, query_int, route
from procmesh_orchestrator.store import DurableRun


class RunRoutes:
    """The routes of durable runs by id, whatever their agent."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        return [
            route("/api/runs", self.list_runs, "GET", "resourceId", "agentId", "status", "page", "perPage"),
            route("/api/runs/{run_id}", self.get_run, "GET"),
            route("/api/runs/{run_id}/cancel", self.cancel, "POST"),
        ]

    async def list_runs(self, request: Request) -> Response:
        """One page of durable runs, newest first, and how many match."""
        query = request.query_params
        listing = durable.run_query(
            resource_id=query.get("resourceId"),
            agent_id=query.get("agentId"),
            status=query.get("status"),
            page=query_int(query.get("page"), "page", 0, 0),
            per_page=query_int(query.get("perPage"), "perPage", durable.DEFAULT_RUNS_PER_PAGE, 1),
            caller=caller_of(request),
        )
        runs, total = await durable.list_runs(self.core, listing)
        return json_response({"runs": [run_json(r) for r in runs], "total": total})

    async def get_run(self, request: Request) -> Response:
        """The run's record (404 for another resource's, as for none)."""
        record = await durable.visible_run(self.core, request.path_params["run_id"], caller_of(request))
        return json_response(run_json(record))

    async def cancel(self, request: Request) -> Response:
        """Ask the run to stop: whether it was still going, and the run after the request."""
        run_id = request.path_params["run_id"]
        cancelled, after = await control.cancel_durable(self.core, run_id, caller_of(request))
        return json_response({"cancelled": cancelled, "run": run_json(after)})


def run_json(record: DurableRun) -> dict[str, Any]:
    """A durable run as the HTTP API shows it (``null`` for an empty thread, resource or error)."""
    return {
        "runId": record.run_id,
        "agentId": record.agent_id,
        "threadId": record.thread_id or None,
        "resourceId": record.resource_id or None,
        "status": record.status,
        "attempts": record.attempts,
        "createdAt": record.created_at,
        "updatedAt": record.updated_at,
        "error": record.error or None,
        "cancelRequested": record.cancel_requested,
    }
