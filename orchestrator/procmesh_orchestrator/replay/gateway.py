"""The candidate's model gateway during a replay: the serving orchestrator's ModelService (the same
servicer and guard, `service.grpc.server.gateway_server`) on a unix socket in a private folder,
given to the built-in sidecar the candidate's App starts as `procmesh serve` gives it the port.

A guard that judges with a model (moderation, prompt injection, ...) so calls the candidate's
judge model for real, with the candidate's ``judgeCache``: a judge's verdict is not in the record
(only the agent's model output is, and that stays answered from it). `judge_calls` counts what the
gateway asked a model, per calling processor.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter

import grpc

from procmesh_orchestrator.app import App
from procmesh_orchestrator.sidecar_process import ModelGateway

_ASKED = frozenset({"ok", "invalid_output", "api_error", "deadline", "cancelled"})
"""Gateway call outcomes that reached the model (the rest were refused before any model call)."""
_SAVED = frozenset({"cache", "merged", "repeat"})
"""Why a gateway call that reached the judge planner made no model call of its own (`judge_planner`,
`verdict_cache`): the verdict cache answered, another guard's merged call carried its section, or
the same question was answered moments ago."""


class ReplayGateway:
    """Serves `app`'s models to its sidecars from `start()` to `stop()`."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._dir: str | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> ModelGateway:
        """Serve; where the sidecars reach it (no key: the socket's folder is this user's only)."""
        # Imported here: the service room runs replay jobs (it imports this room), so this room
        # cannot import it while it loads.
        from procmesh_orchestrator.service.api.core import ServiceCore
        from procmesh_orchestrator.service.grpc.server import gateway_server
        from procmesh_orchestrator.settings import OrchestratorSettings

        self._dir = tempfile.mkdtemp(prefix="procmesh-replay-gateway-")  # mode 0700
        socket = os.path.join(self._dir, "gateway.sock")
        core = ServiceCore(OrchestratorSettings(api_keys=[]), self._app.config, app=self._app)
        self._server = gateway_server(core, socket)
        await self._server.start()
        return ModelGateway(f"unix://{socket}")

    async def stop(self) -> None:
        """Stop serving (a call still running is cancelled) and remove the socket's folder."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def judge_calls(self) -> Counter[str]:
        """Model calls the gateway made so far, by calling processor (the gateway's label): its
        calls that reached a model, less those it answered without one (`_SAVED`). A merged call
        of several guards counts once, under the first of them."""
        metrics = self._app.metrics
        calls: Counter[str] = Counter()
        for family in metrics.gateway_calls.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["outcome"] in _ASKED:
                    calls[sample.labels["processor"]] += int(sample.value)
        for family in metrics.judge_calls_saved.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["by"] in _SAVED:
                    calls[sample.labels["processor"]] -= int(sample.value)
        return calls
