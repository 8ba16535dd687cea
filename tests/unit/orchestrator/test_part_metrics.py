"""A batch's part latencies are observed at once (`observe_many`): the histogram then holds what
the same observations made one by one give (it reads prometheus_client's buckets, so a release
that keeps them otherwise fails here)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from procmesh_orchestrator.processors.stream_call import observe_many

BUCKETS = (0.001, 0.01, 0.1)


def samples(histogram: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("amount", [0.0, 0.0005, 0.001, 0.005, 0.1, 0.5])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_observe_many_is_n_observations(amount: float, n: int) -> None:
    one = Histogram("one_seconds", "", ["p"], buckets=BUCKETS, registry=CollectorRegistry())
    many = Histogram("one_seconds", "", ["p"], buckets=BUCKETS, registry=CollectorRegistry())
    for _ in range(n):
        one.labels("x").observe(amount)
    observe_many(many.labels("x"), amount, n)
    assert samples(many) == pytest.approx(samples(one))  # the sum: amount * n, not n additions
    assert samples(many)[("one_seconds_count", "")] == n
