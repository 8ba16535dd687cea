"""Per-hook metrics the SDK records for every processor (authors add none)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class SidecarMetrics:
    """Hook call counts by outcome and hook latency, on an injectable registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.hook_calls = Counter(
            "procmesh_sidecar_hook_calls_total",
            "Hook calls served, by processor, hook and outcome (ok, abort, error code).",
            ["processor", "hook", "outcome"],
            registry=registry,
        )
        self.hook_latency = Histogram(
            "procmesh_sidecar_hook_duration_seconds",
            "Time spent in a processor hook (per part for process_output_stream).",
            ["processor", "hook"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
