"""A lane given as a function of the request context (the seeds' ``inputProcessors: ({
requestContext }) => [...]``): called once as a run starts, before processInput; a per-call list
replaces it; memory's processors stay around what it chose; a resumed run chooses again from the
caller's context its snapshot kept, so it goes on with the lanes it started with."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from procmesh_orchestrator.errors import ConfigError, RequestContextError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import CallOptions, Lanes, snapshot
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.hooks import LaneEntry
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.types import ContextLane, choosing_context
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply
from tests.unit.orchestrator.run.memory_store import DictStore


def _seen(key: str) -> FakeProcessor:
    return FakeProcessor(key, {"process_input": lambda args, info: reply()})


STRICT, LOOSE, OUT = _seen("strict"), _seen("loose"), FakeProcessor("out")


class TenantLane:
    """acme gets the strict lane, anyone else the loose one; remembers what it was given."""

    def __init__(self) -> None:
        self.contexts: list[Mapping[str, Any]] = []

    def __call__(self, request_context: Mapping[str, Any]) -> Sequence[LaneEntry]:
        self.contexts.append(request_context)
        return [STRICT] if request_context.get("tenant") == "acme" else [LOOSE]


def _agent(log: list[Call], lane: Any, **spec: Any) -> Any:
    a = agent(FakeModel({"text": "ok"}, {"text": "ok"}), log, **spec)
    a.spec.lanes = Lanes(input=lane, output=(OUT,))
    return a


async def test_each_run_gets_the_lane_its_context_chooses_and_the_function_only_reads_it() -> None:
    log: list[Call] = []
    lane = TenantLane()
    a = _agent(log, lane)
    await a.generate("hi", CallOptions(request_context={"tenant": "acme"}))
    await a.generate("hi", CallOptions(request_context={"tenant": "globex"}))
    assert [c.processor for c in log] == ["strict", "loose"]
    assert [dict(c) for c in lane.contexts] == [{"tenant": "acme"}, {"tenant": "globex"}]
    with pytest.raises(TypeError):
        lane.contexts[0]["tenant"] = "globex"  # type: ignore[index]


async def test_a_per_call_list_replaces_it_and_it_is_not_called() -> None:
    log: list[Call] = []
    lane = TenantLane()
    a = _agent(log, lane)
    await a.generate("hi", CallOptions(request_context={"tenant": "acme"}, input_processors=[LOOSE]))
    assert [c.processor for c in log] == ["loose"]
    assert lane.contexts == []


async def test_memory_stays_around_the_chosen_lane() -> None:
    store = DictStore()
    a = _agent([], TenantLane(), memory=AgentMemory(store, 10, "dict://test"))
    run = Run(
        a.spec,
        "hi",
        CallOptions(request_context={"tenant": "acme"}, thread_id="t1", resource_id="u1"),
        sink=None,
        metrics=OrchestratorMetrics(),
    )
    assert run.memory is not None
    assert run.input_lane == (run.memory.history, STRICT)
    assert run.output_lane == (OUT, run.memory.history)


def _refusing(request_context: Mapping[str, Any]) -> Sequence[LaneEntry]:
    raise RequestContextError("requestContext.tenant: unknown tenant", keys=["tenant"])


def _broken(request_context: Mapping[str, Any]) -> Sequence[LaneEntry]:
    return [STRICT] if request_context["tier"] else []


@pytest.mark.parametrize(
    ("lane", "error", "message"),
    [
        (_refusing, RequestContextError, "requestContext.tenant: unknown tenant"),
        (_broken, ConfigError, r"agent 'a''s input lane: its function raised KeyError\('tier'\)"),
        (lambda rc: "guard", ConfigError, "agent 'a''s input lane: its function returned str, not a list"),
        (
            lambda rc: ["guard"],
            ConfigError,
            r"agent 'a''s input lane: its function returned 'guard' at 0, not a bound lane entry",
        ),
    ],
)
async def test_a_function_that_fails_fails_the_run_before_any_hook(
    lane: Any, error: type[Exception], message: str
) -> None:
    log: list[Call] = []
    model = FakeModel({"text": "ok"})
    a = agent(model, log)
    a.spec.lanes = Lanes(input=lane)
    with pytest.raises(error, match=message):
        await a.generate("hi", CallOptions(request_context={"tenant": "acme"}))
    assert log == []
    assert model.requests == []
    with pytest.raises(error, match=message):  # what the APIs call as they admit a request: a 400
        a.check_call(CallOptions(request_context={"tenant": "acme"}))


def test_a_resumed_run_chooses_from_the_context_it_started_with() -> None:
    lane = TenantLane()
    a = _agent([], lane)
    run = Run(
        a.spec,
        "hi",
        CallOptions(request_context={"tenant": "acme"}),
        sink=None,
        metrics=OrchestratorMetrics(),
    )
    data = json.loads(json.dumps(snapshot.capture(run, next_step=1)))
    resumed = Run.resume(a.spec, data, None, CallOptions(), sink=None, metrics=OrchestratorMetrics())
    assert resumed.input_lane == (STRICT,)
    assert [dict(c) for c in lane.contexts] == [{"tenant": "acme"}, {"tenant": "acme"}]


async def test_lanes_are_chosen_with_the_runs_resource_which_the_caller_cannot_set() -> None:
    log: list[Call] = []
    contexts: list[dict[str, Any]] = []

    def saw(args: Any, info: Any) -> Any:
        contexts.append(dict(info.request_context))
        return reply()

    def seeing(key: str) -> FakeProcessor:
        return FakeProcessor(key, {"process_input": saw})

    acme, other = seeing("acme"), seeing("other")
    a = _agent(log, lambda rc: [acme] if rc.get("resourceId") == "acme" else [other])
    await a.generate("hi", CallOptions(resource_id="acme", request_context={"tenant": "x"}))
    await a.generate("hi", CallOptions(resource_id="globex", request_context={"resourceId": "acme"}))
    assert [c.processor for c in log] == ["acme", "other"]
    assert contexts == [{"tenant": "x"}, {"resourceId": "acme"}]  # hooks get the caller's as it is
    by_resource = Lanes(input_by_context=ContextLane("resourceId", {"acme": (acme,)}, (other,)))
    assert by_resource.chosen("input", choosing_context(CallOptions(resource_id="acme"))) == (acme,)
    assert by_resource.chosen("input", choosing_context(CallOptions())) == (other,)
