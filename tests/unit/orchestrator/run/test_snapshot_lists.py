"""A call's processor lists through a snapshot: kept by name, bound again where the run resumes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from procmesh_orchestrator.errors import ConfigError, SuspendError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import CallOptions, snapshot
from procmesh_orchestrator.run.hooks import LaneEntry
from procmesh_orchestrator.run.loop import Run
from tests.unit.orchestrator.run.fakes import FakeModel, FakeProcessor, agent

GUARD, COUNTER, REDACTOR = FakeProcessor("guard"), FakeProcessor("counter"), FakeProcessor("redactor")
HOSTED = {"counter": COUNTER, "redactor": REDACTOR}


def bind(names: Mapping[str, Sequence[str]]) -> dict[str, list[LaneEntry]]:
    """What `call_lanes.bind` does for an orchestrator hosting `HOSTED`."""
    bound: dict[str, list[LaneEntry]] = {}
    for kind, ids in names.items():
        for i, name in enumerate(ids):
            if name not in HOSTED:
                raise ConfigError(f"{kind}Processors.{i}: unknown processor {name!r}")
        bound[kind] = [HOSTED[name] for name in ids]
    return bound


def captured(options: CallOptions) -> dict[str, object]:
    """The run's step-boundary snapshot as the store gives it back (JSON)."""
    spec = agent(FakeModel(), [], output=(GUARD,), bind_lanes=bind).spec
    run = Run(spec, "hi", options, sink=None, metrics=OrchestratorMetrics())
    data: dict[str, object] = json.loads(json.dumps(snapshot.capture(run, next_step=1)))
    return data


def test_the_lists_come_back_bound_by_the_resuming_orchestrator() -> None:
    names = {"output": ["counter", "redactor"], "input": []}
    data = captured(
        CallOptions(output_processors=[COUNTER, REDACTOR], input_processors=[], processor_names=names)
    )
    assert data["processorLists"] == names

    spec = agent(FakeModel(), [], output=(GUARD,), bind_lanes=bind).spec
    resumed = Run.resume(spec, data, None, CallOptions(), sink=None, metrics=OrchestratorMetrics())
    assert resumed.output_lane == (COUNTER, REDACTOR)  # the call's list, not the agent's guard
    assert resumed.input_lane == ()
    assert resumed.options.processor_names == names  # kept for the next snapshot


def test_a_run_without_lists_resumes_with_the_agents_lanes() -> None:
    data = captured(CallOptions())
    assert data["processorLists"] == {}
    spec = agent(FakeModel(), [], output=(GUARD,)).spec  # no binder needed
    resumed = Run.resume(spec, data, None, CallOptions(), sink=None, metrics=OrchestratorMetrics())
    assert resumed.output_lane == (GUARD,)


def test_a_name_the_resuming_orchestrator_lacks_is_an_error_naming_it() -> None:
    data = captured(CallOptions(output_processors=[COUNTER], processor_names={"output": ["counter"]}))
    data["processorLists"] = {"output": ["gone"]}
    spec = agent(FakeModel(), [], bind_lanes=bind).spec
    with pytest.raises(SuspendError, match=r"cannot resume .*outputProcessors\.0: unknown processor 'gone'"):
        snapshot.resumed_options(data, CallOptions(), spec)


def test_a_bound_list_without_its_names_cannot_be_kept() -> None:
    with pytest.raises(SuspendError, match="output processor list is not named"):
        captured(CallOptions(output_processors=[COUNTER]))
    with pytest.raises(SuspendError, match="output processor list is not named"):
        snapshot.call_data(CallOptions(output_processors=[COUNTER]))


def test_a_durable_start_keeps_the_names() -> None:
    options = CallOptions(error_processors=[REDACTOR], processor_names={"error": ["redactor"]})
    call = json.loads(json.dumps(snapshot.call_data(options)))
    spec = agent(FakeModel(), [], bind_lanes=bind).spec
    again = snapshot.resumed_options(call, CallOptions(), spec)
    assert (again.error_processors, again.processor_names) == ([REDACTOR], {"error": ["redactor"]})
