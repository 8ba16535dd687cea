"""The service's /metrics: the App's collectors, the process collector and the API's own series."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from procmesh import __version__

# From a health probe (~1 ms) to a long streamed run (minutes): the SSE stream counts until its end.
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


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
        self.http_latency = Histogram(
            "procmesh_http_request_duration_seconds",
            "HTTP API requests by route template (never the agent id's value) and status code, from "
            "the request head to the last byte sent (a stream's whole run).",
            ["route", "code"],
            buckets=_HTTP_BUCKETS,
            registry=self.registry,
        )
        runtime = f"{platform.python_implementation()} {platform.python_version()}"
        build = Gauge(
            "procmesh_orchestrator_build_info",
            "The orchestrator's version and runtime (always 1).",
            ["version", "runtime"],
            registry=self.registry,
        )
        build.labels(__version__, runtime).set(1)
        self.slow_clients_cut = Counter(
            "procmesh_slow_clients_cut_total",
            "Connections cut because their client left a response unread longer than "
            "PROCMESH_SLOW_CLIENT_SECONDS (its run handled as a disconnect), by API.",
            ["api"],
            registry=self.registry,
        )
        self.context_dropped = Counter(
            "procmesh_request_context_dropped_total",
            "Agent calls run without request-context keys their caller is not trusted for or "
            "their agent does not declare (PROCMESH_UNTRUSTED_CONTEXT=drop), by configured agent; "
            "the keys are in a WARNING log line, never a label.",
            ["agent"],
            registry=self.registry,
        )
        self.settings_ignored = Counter(
            "procmesh_call_settings_ignored_total",
            "Agent calls that named a model setting, body option or client tool key procmesh does "
            "not apply (modelSettings.headers, reasoning, timeout; tracingOptions, scorers, ...; "
            "clientTools.outputSchema, ...; other: a key neither side knows), by setting: the call "
            "ran, with a warning.",
            ["setting"],
            registry=self.registry,
        )
        self.message_keys_ignored = Counter(
            "procmesh_message_keys_ignored_total",
            "Requests (generate, stream, memory saves, processor executes) whose input messages held "
            "a key procmesh accepts but does not apply (textPart.providerOptions, "
            "toolResultPart.isError, ...: docs/service.md lists them), by shape and key: the "
            "request went on without it.",
            ["key"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "procmesh_inflight_runs", "Agent runs in flight (HTTP and gRPC).", registry=self.registry
        )
        self.inflight.set_function(inflight)
