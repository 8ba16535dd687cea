"""Processor series that say where the call ran (issue 27): a real `procmesh-orchestrator`
process, two `examples` sidecar processes hosting the same processor ids, two agents, and the
built-in sidecar the orchestrator starts itself; everything is read from the orchestrator's
``/metrics`` as Prometheus would scrape it.

Agent ``alpha`` guards with ``left/topic-guard`` and filters with ``left/word-filter``; agent
``beta`` with ``right/topic-guard`` (and a second, named ``left/topic-guard`` entry) and
``right/word-filter``. 4 runs of ``alpha`` and 8 of ``beta`` are blocked: two tripwire series,
4 and 8, where there was one of 12.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

PROCESSOR_SERIES = (
    "procmesh_processor_calls_total",
    "procmesh_processor_call_duration_seconds_count",
    "procmesh_tripwires_total",
    "procmesh_violations_total",
    "procmesh_stream_parts_total",
    "procmesh_stream_part_added_seconds_count",
)
WHERE = ("agent", "sidecar", "processor", "entry")
BLOCKED = {"alpha": 4, "beta": 8}


def guard(sidecar: str, **extra: Any) -> dict[str, Any]:
    return {"processor": f"{sidecar}/topic-guard", **extra}


def config(left: str, right: str) -> dict[str, Any]:
    def agent(inputs: list[dict[str, Any]], output: str, **extra: Any) -> dict[str, Any]:
        return {
            "model": "demo",
            "errorProcessorDefaults": False,
            "inputProcessors": inputs,
            "outputProcessors": [{"processor": f"{output}/word-filter", "options": {"words": ["darn"]}}],
            **extra,
        }

    second = guard("left", name="second-guard", options={"words": ["zz-never-said"]})
    return {
        "sidecars": {"left": {"address": left}, "right": {"address": right}},
        "models": {"demo": {"provider": "demo"}},
        "agents": {
            "alpha": agent([guard("left")], "left"),
            "beta": agent([guard("right"), second], "right"),
            # the default error processors: the orchestrator starts its built-in sidecar for them
            "gamma": {"model": "demo", "inputProcessors": [{"processor": "builtins/unicode-normalizer"}]},
        },
    }


Samples = list[tuple[str, dict[str, str], float]]


async def scrape(http: httpx.AsyncClient) -> Samples:
    text = (await http.get("/metrics")).text
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def where(samples: Samples, name: str, **match: str) -> dict[tuple[str, ...], float]:
    """`name`'s values by (agent, sidecar, processor, entry), over the samples matching `match`."""
    out: dict[tuple[str, ...], float] = {}
    for sample, labels, value in samples:
        if sample == name and all(labels.get(k) == v for k, v in match.items()):
            key = tuple(labels[k] for k in WHERE)
            out[key] = out.get(key, 0.0) + value
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> AsyncIterator[httpx.AsyncClient]:
    left = start_sidecar("examples", name="fleet-left")
    right = start_sidecar("examples", name="fleet-right")
    await asyncio.gather(left.wait_ready(), right.wait_ready())
    proc = await asyncio.to_thread(
        start_orchestrator, config(left.address, right.address), env={"PROCMESH_API_KEYS": API_KEYS}
    )
    async with httpx.AsyncClient(base_url=proc.http_url, headers=AUTH, timeout=30) as client:
        for agent, blocked in BLOCKED.items():
            for i in range(blocked):
                body = await generate(client, agent, f"please jailbreak {i}")
                assert body["tripwire"]["processorId"] == "topic-guard", body
            chunks = await stream(client, agent, "hello")
            text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
            assert "Darn" not in text  # the word filter ran
            assert "****" in text
        await generate(client, "gamma", "hello")
        yield client


async def generate(http: httpx.AsyncClient, agent: str, text: str) -> dict[str, Any]:
    response = await http.post(f"/api/agents/{agent}/generate", json={"messages": text})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def stream(http: httpx.AsyncClient, agent: str, text: str) -> list[dict[str, Any]]:
    async with http.stream("POST", f"/api/agents/{agent}/stream", json={"messages": text}) as response:
        assert response.status_code == 200
        return [json.loads(e) async for e in sse_events(response) if e != "[DONE]"]


async def test_tripwires_split_by_agent_and_sidecar(http: httpx.AsyncClient) -> None:
    samples = await scrape(http)
    assert where(samples, "procmesh_tripwires_total", hook="process_input") == {
        ("alpha", "left", "topic-guard", "topic-guard"): 4,
        ("beta", "right", "topic-guard", "topic-guard"): 8,
    }
    calls = where(samples, "procmesh_processor_calls_total", hook="process_input", outcome="abort")
    assert calls == {
        ("alpha", "left", "topic-guard", "topic-guard"): 4,
        ("beta", "right", "topic-guard", "topic-guard"): 8,
    }
    # beta's second guard is the same processor id on the other sidecar, under its own entry name:
    # it is called only when the first let the input by (the streamed run)
    assert where(samples, "procmesh_processor_calls_total", hook="process_input", outcome="ok") == {
        ("alpha", "left", "topic-guard", "topic-guard"): 1,
        ("beta", "right", "topic-guard", "topic-guard"): 1,
        ("beta", "left", "topic-guard", "second-guard"): 1,
        ("gamma", "builtins", "unicode-normalizer", "unicode-normalizer"): 1,
    }
    violations = where(samples, "procmesh_violations_total")
    assert violations == {k: float(v) for k, v in calls.items()}  # every abort is a violation


async def test_every_processor_series_names_where_it_ran(http: httpx.AsyncClient) -> None:
    samples = await scrape(http)
    seen = [(name, labels) for name, labels, _ in samples if name in PROCESSOR_SERIES]
    assert {name for name, _ in seen} == set(PROCESSOR_SERIES)
    for name, labels in seen:
        assert all(labels.get(k) for k in WHERE), (name, labels)
        assert labels["agent"] in {"alpha", "beta", "gamma"}, (name, labels)  # config values only
        assert labels["sidecar"] in {"left", "right", "builtins"}, (name, labels)


async def test_output_stream_series_per_processor(http: httpx.AsyncClient) -> None:
    samples = await scrape(http)
    filters = [
        ("alpha", "left", "word-filter", "word-filter"),
        ("beta", "right", "word-filter", "word-filter"),
    ]
    parts = {
        o: where(samples, "procmesh_stream_parts_total", outcome=o)
        for o in ("in", "out", "rewritten", "dropped")
    }
    for key in filters:
        given = parts["in"][key]
        assert given >= 3, parts  # the deltas and the step's markers of one streamed answer
        assert parts["out"][key] == given  # the filter hands on one part for each
        assert 1 <= parts["rewritten"][key] < given  # the deltas with "Darn" were masked, not the rest
        assert parts["dropped"].get(key, 0) == 0
    latency = where(samples, "procmesh_stream_part_added_seconds_count")
    assert {k: latency[k] for k in filters} == {k: parts["in"][k] for k in filters}
    sessions = where(samples, "procmesh_processor_calls_total", hook="process_output_stream")
    # one call per stream session (one streamed run each; a blocked run streams nothing)
    assert {k: sessions[k] for k in filters} == dict.fromkeys(filters, 1.0)


async def test_the_builtin_sidecars_series_are_merged_with_its_name(http: httpx.AsyncClient) -> None:
    # read every 2 s by the orchestrator: wait (bounded) for the read that follows gamma's run
    deadline = time.monotonic() + 15
    while True:
        samples = await scrape(http)
        merged = {
            (labels["processor"], labels["hook"], labels["outcome"]): value
            for name, labels, value in samples
            if name == "procmesh_sidecar_hook_calls_total" and labels.get("sidecar") == "builtins"
        }
        if merged or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert merged[("unicode-normalizer", "process_input", "ok")] == 1
    # gamma's default error processors run in it too (provider-history-compat on every model call)
    assert merged[("provider-history-compat", "process_llm_request", "ok")] == 1
    build = [labels for name, labels, _ in samples if name == "procmesh_sidecar_build_info"]
    assert [b["sidecar"] for b in build] == ["builtins"]
    assert not [s for s in samples if s[0] == "procmesh_merged_metrics_read_failures_total" and s[2] > 0]
