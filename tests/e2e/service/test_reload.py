"""Reloading the config of a running `procmesh-orchestrator` process (issue 27): SIGHUP and a
change of the config file (a ConfigMap-style ``..data`` symlink swap) swap the pipeline without a
restart; a run in flight keeps the pipeline it started with, a broken config is refused while the
last good one serves, and no run fails across 20 reloads under load.

Everything is real: the orchestrator process, an `examples` sidecar process over a unix socket,
HTTP calls; what a run went through is read from its text (the word filter masks "Darn") and from
the orchestrator's /metrics.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from procmesh_orchestrator.app import config_hash
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

FILTER = {"processor": "guards/word-filter", "options": {"words": ["darn"]}}
"""The processor a reload adds: it masks "Darn" in the demo model's answer."""


def config(sidecar: str, *, filtered: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Agent ``a`` on a slow demo model (a stream lasts ~1.5 s), with the word filter or not."""
    return {
        "sidecars": {"guards": {"address": sidecar}},
        "models": {"demo": {"provider": "demo"}, "slow": {"provider": "demo", "delayMs": 60}},
        "agents": {
            "a": {
                "model": "slow",
                "errorProcessorDefaults": False,
                "outputProcessors": [FILTER] if filtered else [],
            },
            "fast": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}],
                "outputProcessors": [FILTER] if filtered else [],
            },
        },
        **(extra or {}),
    }


def k8s_mount(folder: Path, content: dict[str, Any], generation: int) -> Path:
    """Write `content` as a mounted ConfigMap is updated: a new ``..YYYY`` folder, then the
    ``..data`` symlink swapped to it in one rename; ``config.yaml`` links through ``..data``."""
    target = folder / f"..gen{generation}"
    target.mkdir()
    (target / "config.yaml").write_text(yaml.safe_dump(content), encoding="utf-8")
    tmp = folder / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, folder / "..data")
    link = folder / "config.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/config.yaml")
    return link


def failures(log: str) -> str:
    """The log's error lines and tracebacks (what a failed run left)."""
    lines = log.splitlines()
    marks = [i for i, line in enumerate(lines) if "ERROR" in line or "WARNING" in line or "Traceback" in line]
    return "\n".join("\n".join(lines[i : i + 40]) for i in marks[:3]) or log[-3000:]


def version_of(content: dict[str, Any]) -> str:
    """The version the orchestrator reports for `content` (no PROCMESH_CONFIG__ overrides here)."""
    return config_hash(parse_config(content))


class Orchestrator:
    """The process, its HTTP client and its config file."""

    def __init__(self, proc: OrchestratorProcess, path: Path, sidecar: str) -> None:
        self.proc = proc
        self.path = path
        self.sidecar = sidecar
        self.http = httpx.AsyncClient(base_url=proc.http_url, headers=AUTH, timeout=30)

    def write(self, content: dict[str, Any]) -> None:
        self.path.write_text(yaml.safe_dump(content), encoding="utf-8")

    def sighup(self) -> None:
        self.proc.proc.send_signal(signal.SIGHUP)

    async def version(self) -> str:
        response = await self.http.get("/readyz")
        assert response.status_code == 200, response.text
        return str(response.json()["configVersion"])

    async def metric(self, name: str, **labels: str) -> float:
        """The value of one series in /metrics (0 when it is not there)."""
        text = (await self.http.get("/metrics")).text
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")):
                found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                if all(found.get(k) == v for k, v in labels.items()):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    async def reloads(self, outcome: str) -> float:
        return await self.metric("procmesh_config_reloads_total", outcome=outcome)

    async def wait_reloads(self, outcome: str, count: float, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while await self.reloads(outcome) < count:
            assert time.monotonic() < deadline, f"no {outcome} reload #{count}:\n{self.proc.log()[-3000:]}"
            await asyncio.sleep(0.05)

    async def filter_calls(self, agent: str) -> float:
        return await self.metric(
            "procmesh_processor_calls_total",
            agent=agent,
            processor="word-filter",
            hook="process_output_stream",
        )

    async def generate(self, agent: str, text: str) -> str:
        response = await self.http.post(f"/api/agents/{agent}/generate", json={"messages": text})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["finishReason"] == "stop", (body, failures(self.proc.log()))
        return str(body["text"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> AsyncIterator[Orchestrator]:
    sidecar = start_sidecar("examples", name="reload-guards")
    await sidecar.wait_ready()
    proc = await asyncio.to_thread(
        start_orchestrator,
        config(sidecar.address, filtered=False),
        env={"PROCMESH_API_KEYS": API_KEYS, "PROCMESH_CONFIG_POLL_SECONDS": "0"},  # SIGHUP only here
    )
    orchestrator = Orchestrator(proc, proc.log_path.parent / "config.yaml", sidecar.address)
    yield orchestrator
    await orchestrator.http.aclose()


async def test_a_running_stream_keeps_its_pipeline_and_the_next_run_takes_the_new_one(
    orchestrator: Orchestrator,
) -> None:
    o = orchestrator
    before = await o.version()
    assert await o.metric("procmesh_config_info", version=before) == 1
    texts: list[str] = []
    async with o.http.stream("POST", "/api/agents/a/stream", json={"messages": "hello"}) as response:
        assert response.status_code == 200
        events = sse_events(response)
        async for data in events:  # the run has started on the unfiltered pipeline
            if '"text-delta"' in data:
                texts.append(data)
                break
        applied = await o.reloads("applied")
        o.write(config(o.sidecar, filtered=True))
        o.sighup()
        await o.wait_reloads("applied", applied + 1)
        after = await o.version()
        assert after != before
        async for data in events:
            texts.append(data)
    assert "Darn" in "".join(texts), "the running stream went through the filter the reload added"
    assert texts[-1] == "[DONE]"
    assert await o.filter_calls("a") == 0  # the old pipeline has no filter: never called
    assert "****" in await o.generate("a", "hello")  # the next run takes the new pipeline
    assert await o.filter_calls("a") == 1
    assert await o.metric("procmesh_config_info", version=after) == 1
    assert await o.metric("procmesh_config_info", version=before) == 0  # the old version's series is gone
    assert f"version {after} serves new runs (was {before}" in o.proc.log()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"agents": {"a": {"model": "slow", "outputProcessors": ["guards/no-such"]}}},
            "does not host processor",
        ),
        (
            {"storage": {"backend": "sqlite", "path": "/tmp/other.db"}},
            "storage: changed, and it needs a restart",
        ),
        ({"agents": {"a": {"model": "slow", "maxSteps": -1}}}, "agents.a.maxSteps"),
    ],
    ids=["processor-not-hosted", "restart-only-key", "invalid-option"],
)
async def test_a_broken_config_on_sighup_is_refused_and_the_last_good_one_keeps_serving(
    orchestrator: Orchestrator, change: dict[str, Any], reason: str
) -> None:
    o = orchestrator
    good = config(o.sidecar, filtered=True)  # serving since the first test (refusals keep it)
    version = await o.version()
    refused = await o.reloads("refused")
    o.write({**good, **change})
    o.sighup()
    await o.wait_reloads("refused", refused + 1)
    assert await o.version() == version
    assert "****" in await o.generate("fast", "hello")  # still the last good pipeline
    refusals = [line for line in o.proc.log().splitlines() if "refused, still serving" in line]
    assert reason in refusals[-1], refusals[-1]
    o.write(good)  # leave the good one in the file for the next test


async def test_a_change_of_the_mounted_config_file_reloads_it(
    start_orchestrator: Callable[..., OrchestratorProcess], orchestrator: Orchestrator, tmp_path: Path
) -> None:
    folder = tmp_path / "configmap"
    folder.mkdir()
    link = k8s_mount(folder, config(orchestrator.sidecar, filtered=False), 1)
    proc = await asyncio.to_thread(
        start_orchestrator,
        {"agents": {}},  # replaced by --config below
        "--config",
        str(link),
        env={"PROCMESH_API_KEYS": API_KEYS, "PROCMESH_CONFIG_POLL_SECONDS": "0.2"},
    )
    o = Orchestrator(proc, link, orchestrator.sidecar)
    assert "Darn" in await o.generate("fast", "hello")
    k8s_mount(folder, config(o.sidecar, filtered=True), 2)  # no signal: the poll sees the new content
    await o.wait_reloads("applied", 1)
    assert "****" in await o.generate("fast", "hello")
    assert "(config file changed)" in proc.log()
    await o.http.aclose()
    proc.terminate()


async def test_no_run_fails_across_20_reloads_under_load(orchestrator: Orchestrator) -> None:
    o = orchestrator
    stop = asyncio.Event()
    outcomes: list[str] = []

    async def client() -> None:
        while not stop.is_set():
            response = await o.http.post("/api/agents/fast/generate", json={"messages": "hello"})
            ok = response.status_code == 200
            outcomes.append(
                f"200 {response.json()['finishReason']}" if ok else f"{response.status_code} {response.text}"
            )

    applied = await o.reloads("applied")
    serving = await o.version()
    first = next(f for f in (True, False) if version_of(config(o.sidecar, filtered=f)) != serving)
    clients = [asyncio.create_task(client()) for _ in range(4)]
    try:
        for i in range(20):
            o.write(config(o.sidecar, filtered=first if i % 2 == 0 else not first))
            o.sighup()
            await o.wait_reloads("applied", applied + i + 1)
            await asyncio.sleep(0.05)  # runs start on the new pipeline before the next swap
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert len(outcomes) >= 20
    assert set(outcomes) == {"200 stop"}, failures(o.proc.log())
    assert await o.reloads("applied") == applied + 20
    # Each replaced pipeline is closed once its last run ended (the runs are over: all of them).
    deadline = time.monotonic() + 10
    while o.proc.log().count(" retired: its last run ended") < applied + 20:
        assert time.monotonic() < deadline, o.proc.log()[-3000:]
        await asyncio.sleep(0.05)
