"""Replay jobs (issue 31 item 4): ``POST /api/replays`` starts `procmesh replay`'s work in this
process's background and answers its id at once; ``GET /api/replays/{id}`` gives its status and,
once done, the report (`Report.to_json`, the CLI's ``--json``). Operators only: a replay reads
every tenant's recorded runs. Jobs live in this process's memory (a restart forgets them)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import yaml

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.config.loading import load_yaml
from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.replay import Selection, replay
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, ForbiddenError, ReplayJobGoneError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.durable import store_of

log = logging.getLogger(__name__)

BODY_KEYS = frozenset({"runId", "agentId", "since", "until", "config"})
MAX_JOBS = 100
"""Finished jobs kept for reading (the oldest go first)."""


def _candidate(raw: Any) -> Any:
    """The body's ``config``: a mapping, or YAML (or JSON) text of one."""
    if isinstance(raw, str):
        try:
            raw = load_yaml(raw)  # as the config file is read: a key given twice is refused
        except yaml.YAMLError as exc:
            raise BadRequestError(f"config: not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise BadRequestError("config: must be the candidate configuration (an object, or its YAML text)")
    try:
        return parse_config(raw, "candidate config")
    except OrchestratorError as exc:
        raise BadRequestError(str(exc)) from None


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise BadRequestError(f"{key}: must be a non-empty string")
    return value


class ReplayJobs:
    """This process's replay jobs by id."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.jobs: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, body: Any, caller: Caller) -> str:
        """Check the body and start the job (400 naming what is wrong, 403 for a tenant key)."""
        if not caller.operator:
            raise ForbiddenError("replay jobs read every tenant's recorded runs: an operator key only")
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        if unknown := sorted(set(body) - BODY_KEYS):
            raise BadRequestError(f"unknown keys {unknown} (a replay job takes {sorted(BODY_KEYS)})")
        if "config" not in body:
            raise BadRequestError("config: the candidate configuration is required")
        selection = Selection(*(_text(body, k) for k in ("runId", "agentId", "since", "until")))
        try:
            selection.check()
        except OrchestratorError as exc:
            raise BadRequestError(str(exc)) from None
        candidate = _candidate(body["config"])
        job_id = uuid.uuid4().hex
        job: dict[str, Any] = {"id": job_id, "status": "running", "result": None, "error": None}
        self.jobs[job_id] = job
        finished = [k for k, j in self.jobs.items() if j["status"] != "running"]
        for oldest in finished[: max(0, len(self.jobs) - MAX_JOBS)]:
            del self.jobs[oldest]

        async def work() -> None:
            try:
                report = await replay(await store_of(self.core.app), candidate, selection)
                job.update(status="done", result=json.loads(json.dumps(report.to_json())))
            except OrchestratorError as exc:
                job.update(status="failed", error=str(exc))
            except Exception as exc:  # a bug: said so in the job, and logged with its traceback
                log.exception("replay job %s failed", job_id)
                job.update(status="failed", error=f"replay failed: {exc!r}")

        task = asyncio.get_running_loop().create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job_id

    def get(self, job_id: str, caller: Caller) -> dict[str, Any]:
        """The job's status (running, done, failed), its report once done, its error once failed."""
        if not caller.operator:
            raise ForbiddenError("replay jobs read every tenant's recorded runs: an operator key only")
        job = self.jobs.get(job_id)
        if job is None:
            raise ReplayJobGoneError(f"no replay job {job_id[:64]!r} in this process")
        return dict(job)
