"""The hooks' metrics are added to as plain numbers (`Series`) and carried into the prometheus
series when collected: what a scrape shows must be what per-call updates would have shown."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest

from procmesh._metrics import _LATENCY_BUCKETS, Series, SidecarMetrics

LATENCIES = [0.0001, 0.0005, 0.0007, 0.003, 0.0025, 0.2, 9.5, 10.0, 42.0]
"""Below the first bound, on bounds (a bound's bucket holds it), between, above the last."""


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(registry: CollectorRegistry, name: str) -> Samples:
    """`name`'s samples (without the processor and hook labels, nor `_created`)."""
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("processor", "hook")))): (
            s.value
        )
        for metric in registry.collect()
        if metric.name == name
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def direct(values: list[float]) -> Samples:
    """The histogram prometheus_client itself makes of `values`, observed one by one."""
    registry = CollectorRegistry()
    histogram = Histogram(
        "procmesh_sidecar_hook_duration_seconds",
        "same",
        ["processor", "hook"],
        buckets=_LATENCY_BUCKETS,
        registry=registry,
    )
    child = histogram.labels("p", "process_input")
    for value in values:
        child.observe(value)
    return samples(registry, "procmesh_sidecar_hook_duration_seconds")


def test_a_carried_series_shows_what_observing_each_call_would_have() -> None:
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    series = Series()
    metrics.flush.track(series, "p", "process_input", metrics.hook_calls)
    for value in LATENCIES[:4]:
        series.observe(value)
        series.count("ok")
    series.count("abort")
    got = samples(registry, "procmesh_sidecar_hook_duration_seconds")
    assert got == direct(LATENCIES[:4])
    # A second collection carries only what was added since: nothing counted twice.
    for value in LATENCIES[4:]:
        series.observe(value)
        series.count("ok")
    samples(registry, "procmesh_sidecar_hook_calls_total")
    assert samples(registry, "procmesh_sidecar_hook_duration_seconds") == direct(LATENCIES)
    calls = {"processor": "p", "hook": "process_input"}
    assert registry.get_sample_value("procmesh_sidecar_hook_calls_total", {**calls, "outcome": "ok"}) == 9
    assert registry.get_sample_value("procmesh_sidecar_hook_calls_total", {**calls, "outcome": "abort"}) == 1


def test_a_scrape_of_some_names_only_sees_every_call_too() -> None:
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    series = Series()
    metrics.flush.track(series, "p", "process_output_stream", metrics.stream_parts)
    metrics.flush.track(series, "p", "process_output_stream", metrics.stream_parts)  # a restart: once
    for _ in range(3):
        series.count("ok")
    series.observe(0.002)
    only = registry.restricted_registry(["procmesh_sidecar_stream_parts_total"])
    text = generate_latest(only).decode()
    assert 'procmesh_sidecar_stream_parts_total{outcome="ok",processor="p"} 3.0' in text
    text = generate_latest(registry.restricted_registry(["procmesh_sidecar_hook_duration_seconds_count"]))
    assert 'procmesh_sidecar_hook_duration_seconds_count{hook="process_output_stream",processor="p"} 1.0' in (
        text.decode()
    )
