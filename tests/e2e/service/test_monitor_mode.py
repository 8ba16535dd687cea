"""A guard rolled out in ``mode: monitor`` (issue 27): a real `procmesh-orchestrator` process and a
real `examples` sidecar. What each monitored entry would have done (block, rewrite, retry) is
counted per decision in ``procmesh_monitor_decisions_total`` and logged, with the run's id, in
the orchestrator's JSON log; nothing of it is applied. Switching the entries to ``enforce`` is a
config change the running process reloads (SIGHUP): the next run is blocked.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

WHERE = {"agent": "a", "sidecar": "guards"}
TEXT = "please jailbreak"


def config(sidecar: str, mode: str) -> dict[str, Any]:
    return {
        "sidecars": {"guards": {"address": sidecar}},
        "models": {"demo": {"provider": "demo"}},
        "agents": {
            "a": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "guards/topic-guard", "mode": mode}],
                "outputProcessors": [
                    {"processor": "guards/word-filter", "mode": mode, "options": {"words": ["darn"]}},
                    {"processor": "guards/length-check", "mode": mode, "options": {"max_words": 5}},
                ],
            }
        },
    }


class Orchestrator:
    def __init__(self, proc: OrchestratorProcess, sidecar: str) -> None:
        self.proc = proc
        self.sidecar = sidecar
        self.http = httpx.AsyncClient(base_url=proc.http_url, headers=AUTH, timeout=30)

    async def samples(self, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
        text = (await self.http.get("/metrics")).text
        return {
            tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in {**WHERE, **match}.items())
        }

    async def value(self, name: str, **match: str) -> float:
        return sum((await self.samples(name, **match)).values())

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.proc.log().splitlines() if line.startswith("{")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> AsyncIterator[Orchestrator]:
    sidecar = start_sidecar("examples", name="monitor-guards")
    await sidecar.wait_ready()
    proc = await asyncio.to_thread(
        start_orchestrator,
        config(sidecar.address, "monitor"),
        env={
            "PROCMESH_API_KEYS": API_KEYS,
            "PROCMESH_LOG_FORMAT": "json",
            "PROCMESH_CONFIG_POLL_SECONDS": "0",  # SIGHUP only
        },
    )
    orchestrator = Orchestrator(proc, sidecar.address)
    yield orchestrator
    await orchestrator.http.aclose()


async def test_monitored_entries_record_what_they_would_do_and_apply_nothing(
    orchestrator: Orchestrator,
) -> None:
    async with orchestrator.http.stream("POST", "/api/agents/a/stream", json={"messages": TEXT}) as response:
        assert response.status_code == 200
        chunks = [json.loads(e) async for e in sse_events(response) if e != "[DONE]"]
    kinds = [c["type"] for c in chunks]
    assert "tripwire" not in kinds
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert "Darn" in text  # the monitored word filter's masking is not applied
    assert kinds.count("step-finish") == 1  # nor the monitored length check's retry
    run_id = chunks[0]["payload"]["runId"]

    decisions = {
        (dict(labels)["processor"], dict(labels)["hook"], dict(labels)["would"]): value
        for labels, value in (await orchestrator.samples("procmesh_monitor_decisions_total")).items()
    }
    deltas = kinds.count("text-delta")
    masked = sum(1 for c in chunks if c["type"] == "text-delta" and "darn" in c["payload"]["text"].lower())
    assert deltas > masked >= 1
    # one decision per part the filter answered: the deltas it would mask, and the rest it would pass
    given = await orchestrator.value("procmesh_stream_parts_total", processor="word-filter", outcome="in")
    assert given > deltas
    assert decisions == {
        ("topic-guard", "process_input", "abort"): 1,
        ("word-filter", "process_output_stream", "rewrite"): masked,
        ("word-filter", "process_output_stream", "pass"): given - masked,
        ("length-check", "process_output_step", "retry"): 1,
    }
    assert await orchestrator.value("procmesh_processor_calls_total", outcome="monitor") == 3  # one session
    assert await orchestrator.value("procmesh_tripwires_total") == 0

    lines = [r for r in orchestrator.log_lines() if r["message"].startswith("monitor: ")]
    assert {r["run_id"] for r in lines} == {run_id}
    assert sorted(r["message"] for r in lines if "word-filter" not in r["message"]) == [
        "monitor: agent a processor length-check (sidecar guards, entry length-check) would retry in "
        "process_output_step (not enforced)",
        "monitor: agent a processor topic-guard (sidecar guards, entry topic-guard) would abort in "
        "process_input (not enforced)",
    ]
    assert len(lines) == 2 + masked  # a pass is counted, not logged
    assert not [r for r in orchestrator.log_lines() if TEXT in r["message"]]  # no user content at INFO


async def test_switching_to_enforce_is_a_reload(orchestrator: Orchestrator) -> None:
    config_path = orchestrator.proc.log_path.parent / "config.yaml"
    config_path.write_text(yaml.safe_dump(config(orchestrator.sidecar, "enforce")), encoding="utf-8")
    before = await orchestrator.http.get("/readyz")
    orchestrator.proc.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (await orchestrator.http.get("/readyz")).json()["configVersion"] == before.json()["configVersion"]:
        assert time.monotonic() < deadline, orchestrator.proc.log()[-3000:]
        await asyncio.sleep(0.05)
    monitored = await orchestrator.value("procmesh_monitor_decisions_total")

    response = await orchestrator.http.post("/api/agents/a/generate", json={"messages": TEXT})
    assert response.status_code == 200, response.text
    assert response.json()["tripwire"]["processorId"] == "topic-guard"
    tripwires = await orchestrator.samples("procmesh_tripwires_total")
    assert list(tripwires.values()) == [1]
    assert dict(next(iter(tripwires)))["processor"] == "topic-guard"
    assert await orchestrator.value("procmesh_monitor_decisions_total") == monitored  # nothing monitored now
