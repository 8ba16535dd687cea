"""The built-in sidecar's metrics, merged into the orchestrator's ``/metrics`` with a ``sidecar`` label.

The orchestrator starts the built-in sidecar itself, on a private unix socket: nothing outside
the pod knows it is there, so a port of its own would need its own scrape target and pod
annotation for a process operators never configured. Instead it serves its SDK series on an
ephemeral loopback port (``--metrics-port 0``, the port it logs), which `MergedSidecarMetrics`
reads every `REFRESH_SECONDS` and hands out in the orchestrator's registry: every
``procmesh_sidecar_*`` series of the built-ins, labelled ``sidecar="builtins"``, scraped with
the orchestrator's. Its ``process_*`` series are left out (they would collide with the
orchestrator's own). A read that fails is counted in
``procmesh_merged_metrics_read_failures_total{sidecar}`` and logged once per failure streak;
the last good read is kept meanwhile (counters only grow, a restart resets them as Prometheus
expects).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.metrics import OrchestratorMetrics

log = logging.getLogger(__name__)

REFRESH_SECONDS = 2.0
"""How often the built-in sidecar's series are read (a scrape sees them this much late at most)."""

PREFIX = "procmesh_sidecar_"
"""The families merged (the SDK's series); the rest (``process_*``) stay out."""

_PORT = re.compile(rb"metrics on http://127\.0\.0\.1:(\d+)/metrics")
_TAIL = 65536
"""Bytes of the sidecar's log read for its metrics port (the last one logged is the live process's)."""


def logged_port(log_path: str) -> int | None:
    """The metrics port the sidecar logged last (a restarted one logs a new port), or None."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL))
            tail = f.read()
    except OSError:
        return None
    found = _PORT.findall(tail)
    return int(found[-1]) if found else None


class MergedSidecarMetrics:
    """A collector on the orchestrator's registry giving the last read of one sidecar's series."""

    def __init__(self, metrics: OrchestratorMetrics, sidecar: str, log_path: str) -> None:
        self.sidecar = sidecar
        self.log_path = log_path
        self.families: list[Metric] = []
        self.failures = metrics.merged_metrics_read_failures
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self.registry = metrics.registry
        self.registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # the names come from the sidecar: nothing to check when registering

    def collect(self) -> Iterator[Metric]:
        yield from self.families

    def start(self) -> None:
        """Read the sidecar's series now and every `REFRESH_SECONDS`."""
        self._task = asyncio.create_task(self._refresh())

    async def stop(self) -> None:
        """Stop reading; its series leave the registry."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.registry.unregister(self)

    async def _refresh(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as http:
            while True:
                await self.read(http)
                await asyncio.sleep(REFRESH_SECONDS)

    async def read(self, http: httpx.AsyncClient) -> bool:
        """One read; whether it worked (a failure is counted, and logged once per streak)."""
        port = await asyncio.to_thread(logged_port, self.log_path)
        try:
            if port is None:
                raise OSError("it has not logged its metrics port")
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
            response.raise_for_status()
            self.families = relabel(response.text, self.sidecar)
        except (OSError, httpx.HTTPError, ValueError) as exc:
            self.failures.labels(self.sidecar).inc()
            if not self._failing:
                log.warning("the %s sidecar's metrics cannot be read: %s", self.sidecar, exc)
            self._failing = True
            return False
        self._failing = False
        return True


def relabel(text: str, sidecar: str) -> list[Metric]:
    """The ``procmesh_sidecar_*`` families of a sidecar's exposition, each sample labelled `sidecar`."""
    out: list[Metric] = []
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        metric = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            labels: dict[str, Any] = {**sample.labels, "sidecar": sidecar}
            metric.add_sample(sample.name, labels, sample.value, sample.timestamp)
        out.append(metric)
    return out
