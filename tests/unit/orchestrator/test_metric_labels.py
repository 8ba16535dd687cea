"""Where a processor series says it ran (issue 27): its labels, the `mode` key, and the built-in
sidecar's series merged into the orchestrator's registry."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from procmesh_orchestrator.config import ProcessorRef, parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.metrics import OWN_SIDECAR, OrchestratorMetrics, series
from procmesh_orchestrator.sidecar_metrics import logged_port, relabel


def test_the_labels_name_agent_sidecar_hosted_id_and_entry() -> None:
    assert series("a", "second-guard", ("left", "topic-guard")) == (
        "a",
        "left",
        "topic-guard",
        "second-guard",
    )
    # a processor the orchestrator runs itself
    assert series("a", "token-cost-control", None) == (
        "a",
        OWN_SIDECAR,
        "token-cost-control",
        "token-cost-control",
    )


def test_total_sums_over_the_labels_left_out() -> None:
    metrics = OrchestratorMetrics()
    metrics.tripwires.labels("a", "left", "g", "g", "process_input").inc(4)
    metrics.tripwires.labels("b", "right", "g", "g", "process_input").inc(8)
    assert metrics.total("procmesh_tripwires_total", processor="g") == 12
    assert metrics.total("procmesh_tripwires_total", sidecar="right") == 8
    assert metrics.total("procmesh_tripwires_total", agent="c") == 0


def lane(mode: str) -> dict[str, object]:
    return {
        "sidecars": {"s": {"address": "127.0.0.1:1"}},
        "agents": {"a": {"model": "demo", "inputProcessors": [{"processor": "s/topic-guard", "mode": mode}]}},
    }


@pytest.mark.parametrize(
    ("given", "read"), [("monitor", "monitor"), ("shadow", "monitor"), ("enforce", "enforce")]
)
def test_mode_monitor_and_its_former_name(given: str, read: str) -> None:
    (ref,) = parse_config(lane(given), "test").agents["a"].input_processors
    assert isinstance(ref, ProcessorRef)
    assert ref.mode == read


def test_an_unknown_mode_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"agents\.a\.inputProcessors\.0.*mode"):
        parse_config(lane("observe"), "test")


def test_a_sidecars_series_are_relabelled_and_its_process_series_left_out() -> None:
    child = CollectorRegistry()
    calls = Counter(
        "procmesh_sidecar_hook_calls_total", "calls", ["processor", "hook", "outcome"], registry=child
    )
    calls.labels("unicode-normalizer", "process_input", "ok").inc(3)
    Counter("process_made_up_total", "a process series", registry=child).inc()
    families = relabel(generate_latest(child).decode(), "builtins")
    parent = CollectorRegistry()
    OrchestratorMetrics(parent)

    class Fixed(Collector):
        def collect(self) -> Iterable[Metric]:
            return families

    parent.register(Fixed())
    samples = [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(generate_latest(parent).decode())
        for s in f.samples
        if s.name.startswith(("procmesh_sidecar_hook", "process_made_up")) and not s.name.endswith("_created")
    ]
    assert samples == [
        (
            "procmesh_sidecar_hook_calls_total",
            {
                "processor": "unicode-normalizer",
                "hook": "process_input",
                "outcome": "ok",
                "sidecar": "builtins",
            },
            3.0,
        )
    ]


def test_the_metrics_port_is_the_last_one_logged(tmp_path: Path) -> None:
    log = tmp_path / "builtins.log"
    assert logged_port(str(log)) is None  # no log yet
    log.write_text(
        "metrics on http://127.0.0.1:4001/metrics\nexited\nmetrics on http://127.0.0.1:4002/metrics\n"
    )
    assert logged_port(str(log)) == 4002  # restarted: the live process's port
