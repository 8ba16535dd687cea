"""The service's /metrics: the App's collectors, the process collector and the API's own series."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class _Forward(Collector):
    """Exposes another registry's metrics through this one (one exposition, one ``# EOF``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


class _SidecarServing(Collector):
    """``procmesh_sidecar_serving{sidecar}``, read at scrape time from the last health poll."""

    def __init__(self, statuses: Callable[[], Mapping[str, str]]) -> None:
        self._statuses = statuses

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "procmesh_sidecar_serving",
            "1 when the sidecar's last grpc.health.v1 check said SERVING, else 0.",
            labels=["sidecar"],
        )
        for name, status in sorted(self._statuses().items()):
            family.add_metric([name], 1.0 if status == "SERVING" else 0.0)
        yield family


class ServiceMetrics:
    """What /metrics exposes; the API series carry no user content (status codes only)."""

    def __init__(
        self,
        app_registry: CollectorRegistry,
        inflight: Callable[[], float],
        sidecar_statuses: Callable[[], Mapping[str, str]],
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Forward(app_registry))
        self.registry.register(_SidecarServing(sidecar_statuses))
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "procmesh_api_requests_total",
            "Requests to the orchestrator's APIs by API (http, grpc) and status code.",
            ["api", "code"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "procmesh_inflight_runs", "Agent runs in flight (HTTP and gRPC).", registry=self.registry
        )
        self.inflight.set_function(inflight)
