"""The orchestrator's per-call series (calls by outcome, call latency) keep their label children
between calls: what a scrape reads is what every call added, across runs and outcomes."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2
from prometheus_client import generate_latest

from procmesh import Processor, ProcessorClient, ProcessorServer
from procmesh_orchestrator import RunInfo
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import GrpcHookCaller
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.run.hooks import InputArgs


class Judge(Processor):
    """Aborts an input whose last message says "stop"."""

    id = "judge"

    async def process_input(self, messages: list[dict[str, Any]], abort: Any) -> None:
        if messages and messages[-1]["content"]["parts"][0]["text"] == "stop":
            abort("stopped")


def args(text: str) -> InputArgs:
    message = {"id": "m", "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}
    return InputArgs(messages=[message], all_messages=[message], system_messages=[])


async def test_calls_and_their_latency_add_up_over_runs_and_outcomes() -> None:
    metrics = OrchestratorMetrics()
    async with ProcessorServer([Judge()]) as server, ProcessorClient(server.addresses[0]) as client:
        handle = ProcessorHandle(
            key="judge",
            processor_id="judge",
            client=client,
            options=struct_pb2.Struct(),
            hooks=frozenset({"process_input"}),
            process_data_parts=False,
            timeout=10.0,
            on_failure="fail-closed",
            sidecar="side",
        )
        for run, texts in enumerate([["go", "go", "stop"], ["go", "stop"]]):
            caller = GrpcHookCaller(RunInfo(run_id=f"r{run}", agent_id="a", request_context={}), metrics)
            for text in texts:
                reply = await caller.call(handle, args(text))
                assert (reply.effects.abort is not None) == (text == "stop")
    calls = "procmesh_processor_calls_total"
    assert metrics.total(calls, agent="a", hook="process_input", outcome="ok") == 3
    assert metrics.total(calls, agent="a", hook="process_input", outcome="abort") == 2
    assert metrics.total("procmesh_processor_call_duration_seconds_count", agent="a") == 5
    scraped = generate_latest(metrics.registry).decode()
    assert 'outcome="ok",processor="judge",sidecar="side"} 3.0' in scraped
    assert "procmesh_processor_call_duration_seconds_count" in scraped
