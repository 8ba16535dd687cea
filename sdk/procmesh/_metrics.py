"""Metrics the SDK records for every processor (authors add none), and the process it runs in."""

from __future__ import annotations

import platform

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from procmesh._version import __version__

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class SidecarMetrics:
    """Hook call counts by outcome, hook latency, the process and the build, on an injectable registry.

    The names are shared with the Node SDK (``lib/metrics.js``), so one dashboard reads sidecars
    in either language: ``procmesh_sidecar_hook_calls_total{processor,hook,outcome}`` (a
    ProcessOutputStream session counts once per processor in it, at its end),
    ``procmesh_sidecar_stream_parts_total{processor,outcome}`` (each part of a stream),
    ``procmesh_sidecar_hook_duration_seconds{processor,hook}`` (a stream's batch observed once: its
    parts' mean; the stream series are updated once per batch, not per part),
    ``procmesh_sidecar_tool_calls_total{tool,outcome}``, ``procmesh_sidecar_tool_duration_seconds{tool}``
    (hosted tools),
    ``procmesh_sidecar_build_info{sdk,version,runtime}`` and the ``process_*`` series.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.hook_calls = Counter(
            "procmesh_sidecar_hook_calls_total",
            "Hook calls served, by processor, hook and outcome (ok, abort, cancelled, error code); "
            "a process_output_stream session counts once, at its end.",
            ["processor", "hook", "outcome"],
            registry=registry,
        )
        self.stream_parts = Counter(
            "procmesh_sidecar_stream_parts_total",
            "Output-stream parts given to a processor's hook, by outcome (ok, abort, error code).",
            ["processor", "outcome"],
            registry=registry,
        )
        self.hook_latency = Histogram(
            "procmesh_sidecar_hook_duration_seconds",
            "Time spent in a processor hook (process_output_stream: a batch's mean per part, once a batch).",
            ["processor", "hook"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tool_calls = Counter(
            "procmesh_sidecar_tool_calls_total",
            "Hosted tool calls served, by tool and outcome (ok, tool_error, cancelled, error code).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.tool_latency = Histogram(
            "procmesh_sidecar_tool_duration_seconds",
            "Time spent in a hosted tool's execute().",
            ["tool"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        # CPU, memory, open fds, start time: what a pod's dashboard shows next to the hooks.
        ProcessCollector(registry=registry)
        # A gauge at 1 rather than an Info: the same name and type as the Node SDK's (prom-client has
        # no Info), so a query over sidecars of both languages needs no special case.
        self.build = Gauge(
            "procmesh_sidecar_build_info",
            "The SDK serving this sidecar: language, version, runtime.",
            ["sdk", "version", "runtime", "grpc"],
            registry=registry,
        )
        runtime = f"{platform.python_implementation()} {platform.python_version()}"
        self.build.labels("python", __version__, runtime, grpc.__version__).set(1)
