"""The probes and /metrics over HTTP: ``/healthz`` (the process answers), ``/readyz`` (it should
get traffic: not draining, its sidecars serving, durable runs' dependencies up) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import json_response


class ProbeRoutes:
    """``/metrics``, ``/healthz`` and ``/readyz``: no API key, no ``/api`` prefix."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        return [
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]

    async def metrics(self, request: Request) -> Response:
        """The Prometheus exposition, in the format the scraper accepts."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self.core.metrics.registry), headers={"Content-Type": content_type})

    async def healthz(self, request: Request) -> Response:
        """Alive: answered while the event loop runs."""
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready (200) or not and why (503): draining, sidecars not serving, durable runs' store or
        event log down; a fail-open sidecar that is down is named, not counted against."""
        service = self.core
        if service.gate.draining:
            return json_response({"status": "draining", "configVersion": service.app.version}, 503)
        not_serving = service.health.not_serving
        # A fail-open sidecar that is down degrades runs, it does not fail them: the pod stays in
        # its Service, and the response names it.
        blocking = service.health.blocking
        down = service.health.dependencies
        if blocking or down:
            problems = []
            if blocking:
                problems.append(
                    "sidecars not serving: " + ", ".join(f"{n} is {s}" for n, s in sorted(blocking.items()))
                )
            if down:
                problems.append(
                    "durable runs: " + ", ".join(f"the {n} is {s}" for n, s in sorted(down.items()))
                )
            body_: dict[str, Any] = {
                "status": "not ready",
                "error": "; ".join(problems),
                "notServing": not_serving,
                "configVersion": service.app.version,
            }
            if down:
                body_["durable"] = down
            return json_response(body_, 503)
        body: dict[str, Any] = {
            "status": "ready",
            "sidecars": service.health.statuses,
            "configVersion": service.app.version,  # the config serving new runs (a reload changes it)
        }
        if not_serving:
            body["degraded"] = not_serving
        return json_response(body)
