"""Replay jobs over HTTP: ``POST /api/replays`` (202 and the job's id) and ``GET /api/replays/{id}``
(`service.api.replays`, issue 31)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.replays import ReplayJobs
from procmesh_orchestrator.service.http.bodies import json_response, route


class ReplayRoutes:
    """The replay jobs' routes."""

    def __init__(self, core: ServiceCore, read_json: Callable[[Request], Awaitable[Any]]) -> None:
        self.jobs = ReplayJobs(core)
        self.read_json = read_json

    def routes(self) -> list[Route]:
        return [
            route("/api/replays", self.start, "POST"),
            route("/api/replays/{job_id}", self.get, "GET"),
        ]

    async def start(self, request: Request) -> Response:
        """Start a replay job: 202 and ``{"id", "status"}``."""
        caller = caller_of(request)
        job_id = self.jobs.start(await self.read_json(request), caller)
        return json_response({"id": job_id, "status": "running"}, status=202)

    async def get(self, request: Request) -> Response:
        """The job's status and, once done, its report."""
        return json_response(self.jobs.get(request.path_params["job_id"], caller_of(request)))
