"""Metrics the SDK records for every processor (authors add none), and the process it runs in."""

from __future__ import annotations

import platform
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric

from procmesh._version import __version__

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_BOUNDS = (*_LATENCY_BUCKETS, float("inf"))
"""The histogram's upper bounds as prometheus_client keeps them (+Inf last)."""


class Series:
    """One hook of one processor, counted in plain numbers since the server started: its calls
    (a stream's parts) by outcome, and its latency histogram's buckets and sum.

    Updating prometheus_client's series per call took a lock per counter and per histogram
    bucket: half of the SDK's own Python per unary call. So a call adds to these numbers, and
    `Flush` carries what was added into the prometheus series when the registry is collected
    (a scrape, ``get_sample_value``): a scrape counts every call that ended before it.
    One thread writes a `Series` at a time: the processor's hook loop, run by its thread or by
    the server thread taking its turn, both under the loop's turns lock (`HookLoop`), or the
    server loop when hooks run inline. A call ending while a scrape reads may show in its count
    and not yet in its sum (or the reverse) until the next scrape.
    """

    __slots__ = ("buckets", "outcomes", "seconds")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.buckets = [0] * len(_BOUNDS)
        self.seconds = 0.0

    def count(self, outcome: str) -> None:
        """One more call (stream part) ended with `outcome`."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def observe(self, seconds: float) -> None:
        """One latency observation (the bucket is the first whose bound is not below it)."""
        self.buckets[bisect_left(_BOUNDS, seconds)] += 1
        self.seconds += seconds

    def add(self, outcome: str, seconds: float) -> None:
        """One call that ended with `outcome` after `seconds` (`count` and `observe`)."""
        self.count(outcome)
        self.observe(seconds)


class Flush:
    """Carries what each `Series` added since the last collection into the SDK's prometheus
    series, whenever one of them is collected (a scrape, a scrape of some names only, or
    ``get_sample_value``)."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()  # two scrapes at once must not carry the same calls twice
        self._series: list[tuple[Series, str, str, Any]] = []
        self._carried: dict[int, tuple[dict[str, int], list[int], float]] = {}

    def track(self, series: Series, processor: str, hook: str, counter: Any) -> None:
        """Carry `series` into ``counter.labels(processor, [hook,] outcome)`` and the latency histogram."""
        with self._lock:
            if id(series) not in self._carried:  # a server started again tracks its processors again
                self._series.append((series, processor, hook, counter))
                self._carried[id(series)] = ({}, [0] * len(_BOUNDS), 0.0)

    def before(self, collect: Callable[[], Iterable[Metric]]) -> Callable[[], Iterable[Metric]]:
        """`collect` (a series' own), carrying every `Series` into the series first."""

        def carried() -> Iterable[Metric]:
            with self._lock:
                for series, processor, hook, counter in self._series:
                    self._carry(series, processor, hook, counter)
            return collect()

        return carried

    def _carry(self, series: Series, processor: str, hook: str, counter: Any) -> None:
        outcomes, buckets, seconds = dict(series.outcomes), list(series.buckets), series.seconds
        done_outcomes, done_buckets, done_seconds = self._carried[id(series)]
        labels = (processor,) if counter is self._metrics.stream_parts else (processor, hook)
        for outcome, n in outcomes.items():
            if n != done_outcomes.get(outcome, 0):
                counter.labels(*labels, outcome).inc(n - done_outcomes.get(outcome, 0))
        if buckets != done_buckets:
            # prometheus_client's Histogram child: a value per bucket (not cumulative) and the sum
            child = self._metrics.hook_latency.labels(processor, hook)
            for i, (n, done) in enumerate(zip(buckets, done_buckets, strict=True)):
                if n != done:
                    child._buckets[i].inc(n - done)
            child._sum.inc(seconds - done_seconds)
        self._carried[id(series)] = (outcomes, buckets, seconds)


class SidecarMetrics:
    """Hook call counts by outcome, hook latency, the process and the build, on an injectable registry.

    The names are shared with the Node SDK (``lib/metrics.js``), so one dashboard reads sidecars
    in either language: ``procmesh_sidecar_hook_calls_total{processor,hook,outcome}`` (a
    ProcessOutputStream session counts once per processor in it, at its end),
    ``procmesh_sidecar_stream_parts_total{processor,outcome}`` (each part of a stream),
    ``procmesh_sidecar_hook_duration_seconds{processor,hook}`` (a stream's batch observed once: its
    parts' mean), ``procmesh_sidecar_tool_calls_total{tool,outcome}``,
    ``procmesh_sidecar_tool_duration_seconds{tool}`` (hosted tools),
    ``procmesh_sidecar_build_info{sdk,version,runtime}`` and the ``process_*`` series. The hook
    series are added to in plain numbers per call and carried over when collected (`Series`).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.flush = Flush(self)
        """Carries the hooks' `Series` into the series below whenever one is collected."""
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
        for series in (self.hook_calls, self.stream_parts, self.hook_latency):
            series.collect = self.flush.before(series.collect)  # type: ignore[method-assign]
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
