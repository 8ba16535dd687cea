"""Chaos: a sidecar frozen (SIGSTOP) under 30 concurrent streams, then thawed (SIGCONT).

A real `procmesh-orchestrator` process, real sidecar processes, 30 real HTTP streaming clients
per trial. Under fail-open every stream ends, with every word of the answer in order (the
processor is cut from the streams it held and the run goes on without it); under fail-closed
every stream ends with an error naming the processor. In both, the orchestrator's in-flight
gauge (``procmesh_inflight_runs`` on /metrics) comes back to 0. Layouts: one processor per
session, two fused in one session, and a speculative group across two sidecars (the frozen
one being the second member's). The test waits a bounded time for the streams; a stream still
open then is a hung one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

STREAMS = 30
WORDS = [f"w{i}" for i in range(30)]
ANSWER = " ".join(WORDS)
DELAY_MS = 100
"""30 deltas 100 ms apart: a stream takes about 3 s, so the freeze catches every one mid-stream."""
FREEZE = 2.5
"""Seconds the sidecar stays stopped: longer than its processors' 1 s timeout."""
BOUND = 30.0
"""Seconds the test waits for the streams of a trial: far past every limit in play (1 s per
part, the 3 s answer). A stream still open then is hung."""
TRIALS = [
    ("plain", "fail-open"),
    ("plain", "fail-open"),
    ("fused", "fail-open"),
    ("speculative", "fail-open"),
]
LET_THROUGH = "procmesh_processor_failures_let_through_total"

SCRIPTED = [
    {"id": "pass", "speculative": True, "processOutputStream": [{"when": {}, "do": [{"count": "parts"}]}]},
    {
        "id": "cnt",
        "speculative": True,
        "processOutputStream": [{"when": {"partType": "text-delta"}, "do": [{"count": "n"}]}],
    },
]


def orchestrator_config(faulty: str, spec_a: str, spec_b: str) -> dict[str, Any]:
    sidecar = {"timeout": 1}
    trials = len(TRIALS) + 1
    return {
        "sidecars": {
            "open": {"address": faulty, "onFailure": "fail-open", **sidecar},
            "closed": {"address": faulty, "onFailure": "fail-closed", **sidecar},
            "a": {"address": spec_a, "onFailure": "fail-open", **sidecar},
            "b": {"address": spec_b, "onFailure": "fail-open", **sidecar},
        },
        "models": {
            "m": {
                "provider": "scripted",
                "delayMs": DELAY_MS,
                "responses": [{"text": ANSWER}] * (STREAMS * trials + 10),
            }
        },
        "agents": {
            "plain": agent(["open/counter"]),
            "fused": agent(["open/counter", {"processor": "open/counter", "name": "counter2"}]),
            "speculative": agent(["a/pass", "b/cnt"]),
            "closed": agent(["closed/counter"]),
        },
    }


def agent(lane: list[Any]) -> dict[str, Any]:
    return {"model": "m", "errorProcessorDefaults": False, "outputProcessors": lane}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    sidecar_dir: Path,
) -> tuple[OrchestratorProcess, dict[str, SidecarProcess]]:
    scenario = sidecar_dir / "frozen.json"
    scenario.write_text(json.dumps({"agent": {"outputProcessors": SCRIPTED}}))
    sidecars = {
        "faulty": start_sidecar(name="frozen-faulty", module="tests.fixtures.faulty"),
        "a": start_sidecar("scripted", "--scenario", str(scenario), name="frozen-a"),
        "b": start_sidecar("scripted", "--scenario", str(scenario), name="frozen-b"),
    }
    for proc in sidecars.values():
        await proc.wait_ready()
    config = orchestrator_config(sidecars["faulty"].address, sidecars["a"].address, sidecars["b"].address)
    orchestrator = await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": API_KEYS})
    return orchestrator, sidecars


async def one_stream(http: httpx.AsyncClient, agent_id: str) -> list[Any]:
    events: list[Any] = []
    async with http.stream("POST", f"/api/agents/{agent_id}/stream", json={"messages": "hi"}) as response:
        assert response.status_code == 200, await response.aread()
        async for data in sse_events(response):
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def metrics(http: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await http.get("/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def let_through(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], processor: str) -> float:
    wanted = {("hook", "process_output_stream"), ("processor", processor)}
    return sum(v for (name, labels), v in samples.items() if name == LET_THROUGH and wanted <= set(labels))


async def inflight_settles_to_zero(http: httpx.AsyncClient) -> float:
    """The in-flight gauge, polled until 0 (a run's slot is released just after its last event)."""
    for _ in range(100):
        value = (await metrics(http))[("procmesh_inflight_runs", ())]
        if value == 0:
            return value
        await asyncio.sleep(0.1)
    return value


async def freeze_under_streams(
    orchestrator: OrchestratorProcess, frozen: SidecarProcess, agent_id: str
) -> tuple[list[list[Any]], int]:
    """30 streams; the sidecar stopped 1 s in for `FREEZE` s, then resumed: (their events, hung)."""
    assert frozen.proc is not None
    limits = httpx.Limits(max_connections=STREAMS + 5)
    async with httpx.AsyncClient(
        base_url=orchestrator.http_url, headers=AUTH, timeout=BOUND + 10, limits=limits
    ) as http:
        tasks = [asyncio.create_task(one_stream(http, agent_id)) for _ in range(STREAMS)]
        try:
            await asyncio.sleep(1.0)  # every stream is mid-answer
            os.kill(frozen.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(FREEZE)
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        done, hung = await asyncio.wait(tasks, timeout=BOUND)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        return [task.result() for task in done], len(hung)


def text_of(events: list[Any]) -> str:
    return "".join(c["payload"]["text"] for c in events if isinstance(c, dict) and c["type"] == "text-delta")


@pytest.mark.parametrize(("layout", "policy"), TRIALS)
async def test_a_frozen_fail_open_sidecar_hangs_no_stream(
    setup: tuple[OrchestratorProcess, dict[str, SidecarProcess]], layout: str, policy: str
) -> None:
    orchestrator, sidecars = setup
    frozen = sidecars["b" if layout == "speculative" else "faulty"]
    cut = "cnt" if layout == "speculative" else "counter"
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH) as http:
        before = let_through(await metrics(http), cut)
        streams, hung = await freeze_under_streams(orchestrator, frozen, layout)
        assert hung == 0, f"{hung} of {STREAMS} streams never ended:\n{orchestrator.log()[-3000:]}"
        for events in streams:
            assert events[-1] == "[DONE]"
            assert events[-2]["type"] == "finish", events[-3:]
            assert not [c for c in events[:-1] if c["type"] == "error"], events
            assert text_of(events) == ANSWER  # the parts the cut processor held went on, in order
        # each cut session is counted where the failure policy let the run through
        assert let_through(await metrics(http), cut) - before >= 1
        assert await inflight_settles_to_zero(http) == 0
    assert "skipped (fail-open)" in orchestrator.log()


async def test_a_frozen_fail_closed_sidecar_ends_every_stream_with_the_error(
    setup: tuple[OrchestratorProcess, dict[str, SidecarProcess]],
) -> None:
    orchestrator, sidecars = setup
    streams, hung = await freeze_under_streams(orchestrator, sidecars["faulty"], "closed")
    assert hung == 0, f"{hung} of {STREAMS} streams never ended:\n{orchestrator.log()[-3000:]}"
    for events in streams:
        assert events[-1] == "[DONE]"
        errors = [c for c in events[:-1] if c["type"] == "error"]
        assert errors, events[-3:]
        message = json.dumps(errors[0]["payload"])
        assert "processor 'counter' failed in process_output_stream" in message, message
        assert events[-2]["type"] == "finish"
        assert events[-2]["payload"]["finishReason"] == "error"
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH) as http:
        assert await inflight_settles_to_zero(http) == 0
