"""A run's decision record over HTTP: ``GET /api/runs/{run_id}/decisions`` (issue 31)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service.api import decisions
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import json_response


class DecisionRoutes:
    """The decision record's route."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        return [Route("/api/runs/{run_id}/decisions", self.get, methods=["GET"])]

    async def get(self, request: Request) -> Response:
        """The run's decisions in order (404 for none kept and for another resource's run)."""
        run_id = request.path_params["run_id"]
        found = await decisions.run_decisions(self.core, run_id, caller_of(request))
        return json_response({"runId": run_id, "decisions": [d.to_json() for d in found]})
