"""The decision record over HTTP (issue 31): a run's, ``GET /api/runs/{run_id}/decisions``, and every
run's in a time range, ``GET /api/runs/decisions?since=&until=&agentId=&limit=`` (operators)."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service.api import decisions
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import json_response, route


class DecisionRoutes:
    """The decision record's routes (before the durable runs' ``/api/runs/{run_id}``)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        return [
            route("/api/runs/decisions", self.between, "GET", "since", "until", "agentId", "limit"),
            route("/api/runs/{run_id}/decisions", self.get, "GET"),
        ]

    async def get(self, request: Request) -> Response:
        """The run's decisions in order (404 for none kept and for another resource's run)."""
        run_id = request.path_params["run_id"]
        found = await decisions.run_decisions(self.core, run_id, caller_of(request))
        return json_response({"runId": run_id, "decisions": [d.to_json() for d in found]})

    async def between(self, request: Request) -> Response:
        """Every run's decisions in the range, oldest first, each with its run id."""
        query = request.query_params
        until = query.get("until") or datetime.now(UTC).isoformat()
        raw = query.get("limit") or "1000"  # its range is checked with the call (MAX_BETWEEN)
        limit = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else 0  # '²' isdigit
        found, more = await decisions.decisions_between(
            self.core, caller_of(request), query.get("since"), until, query.get("agentId"), limit
        )
        return json_response(
            {"decisions": [{"runId": d.run_id, **d.to_json()} for d in found], "hasMore": more}
        )
