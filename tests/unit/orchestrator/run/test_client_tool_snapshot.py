"""A client tool's requireApproval through a snapshot: the run a replica resumes or takes over
still holds the caller's client tool for a decision (it was dropped on the way, silently)."""

from __future__ import annotations

import json

from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import CallOptions, snapshot
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.tools import ClientTool
from tests.unit.orchestrator.run.fakes import FakeModel, agent


def test_a_resumed_run_keeps_a_client_tools_approval() -> None:
    spec = agent(FakeModel({"text": "done"}), []).spec
    tools = [ClientTool("locate", "where", {"type": "object"}, True), ClientTool("plain", "p")]
    options = CallOptions(client_tools=tools)
    run = Run(spec, "hi", options, sink=None, metrics=OrchestratorMetrics())
    saved = json.loads(json.dumps(snapshot.capture(run, next_step=1)))
    resumed = Run.resume(spec, saved, None, CallOptions(), sink=None, metrics=OrchestratorMetrics())
    kept = {t.name: t.requires_approval for t in resumed.tools.values() if isinstance(t, ClientTool)}
    assert kept == {"locate": True, "plain": False}
    assert [t.requires_approval for t in resumed.options.client_tools] == [True, False]
