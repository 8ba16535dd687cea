"""prepareStep through a snapshot (SEED-GAPS B28): a call's rules ride in it, so the run a replica
resumes or takes over applies them; a callable cannot, so the resuming call's applies."""

from __future__ import annotations

import json
from typing import Any

from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import CallOptions, snapshot
from procmesh_orchestrator.run.framework.prepare_step import StepContext, StepOverride, StepRule
from procmesh_orchestrator.run.loop import Run
from tests.unit.orchestrator.run.fakes import FakeModel, agent

RULES = (
    StepRule(StepOverride(model_settings={"temperature": 0.5}, system=["Step one on."]), from_step_number=1),
    StepRule(StepOverride(model_settings={"temperature": 0.9}), step_number=2),
)


def _resumed(model: FakeModel, options: CallOptions, resuming: CallOptions) -> Run:
    """A run of `options` snapshotted at its step boundary before step 1, resumed with `resuming`."""
    spec = agent(model, []).spec
    run = Run(spec, "hi", options, sink=None, metrics=OrchestratorMetrics())
    saved = json.loads(json.dumps(snapshot.capture(run, next_step=1)))
    return Run.resume(spec, saved, None, resuming, sink=None, metrics=OrchestratorMetrics())


async def test_a_resumed_run_applies_the_rules_its_snapshot_kept() -> None:
    model = FakeModel({"text": "done"})
    resumed = _resumed(model, CallOptions(prepare_steps=RULES), CallOptions())
    assert resumed.options.prepare_steps == RULES

    result, failure = await resumed.execute()

    assert (failure, result.text.strip()) == (None, "done")
    (request,) = model.requests  # step 1: the first rule's
    assert request.model_settings == {"temperature": 0.5}
    assert [m["content"] for m in request.prompt if m["role"] == "system"] == ["Step one on."]


async def test_a_durable_start_keeps_the_rules() -> None:
    call = json.loads(json.dumps(snapshot.call_data(CallOptions(prepare_steps=RULES))))
    again = snapshot.resumed_options(call, CallOptions(), agent(FakeModel(), []).spec)
    assert again.prepare_steps == RULES


async def test_a_callable_is_the_resuming_calls() -> None:
    seen: list[int] = []

    def prepare(ctx: StepContext) -> dict[str, Any]:
        seen.append(ctx.step_number)
        return {"provider_options": {"fake": {"user": "u-1"}}}

    model = FakeModel({"text": "done"})
    resumed = _resumed(model, CallOptions(), CallOptions(prepare_step=prepare))

    await resumed.execute()

    assert seen == [1]
    assert model.requests[0].provider_options == {"fake": {"user": "u-1"}}
