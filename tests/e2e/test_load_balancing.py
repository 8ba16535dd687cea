"""One sidecar, three replicas: an orchestrator whose sidecar address names them all
(``ipv4:a,b,c``) spreads hook calls over every replica and keeps running when one is killed;
``dns:///localhost:port`` works too. Real processes throughout, started once for the module.

Each replica counts the calls it served in its own ``/metrics``
(``procmesh_sidecar_hook_calls_total``). The replica killed is the last, and the test that kills
it runs last; the others never need it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = pytest.mark.e2e

RUNS = 30
SERVING = re.compile(r"serving processors .* on 127\.0\.0\.1:(\d+)")
METRICS = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")


@dataclass
class Replica:
    """A ``procmesh-sidecar examples`` process on 127.0.0.1, ports chosen by the OS."""

    process: SidecarProcess
    port: int
    metrics_port: int

    async def calls(self) -> float:
        """``process_input`` calls of pii-redactor this replica answered OK, from its /metrics."""
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "procmesh_sidecar_hook_calls_total" and s.labels == {
                    "processor": "pii-redactor",
                    "hook": "process_input",
                    "outcome": "ok",
                }:
                    return s.value
        return 0.0


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


async def _reported_ports(log: Path, process: SidecarProcess) -> tuple[int, int]:
    """The gRPC and metrics ports the replica logged (it logs both once SERVING)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        text = await asyncio.to_thread(_read, log)
        serving, metrics = SERVING.search(text), METRICS.search(text)
        if serving and metrics:
            return int(serving.group(1)), int(metrics.group(1))
        assert process.proc is not None
        assert process.proc.poll() is None, f"replica exited with {process.proc.returncode}: {text}"
        assert loop.time() < deadline, f"replica never reported its ports: {text}"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Replica]]:
    tmp = Path(tempfile.mkdtemp(prefix="pmlb-"))
    procs = []
    for i in range(3):
        log = tmp / f"replica-{i}.log"
        proc = SidecarProcess(["examples", "--metrics-port", "0"], "127.0.0.1:0", log_path=str(log))
        proc.start()
        procs.append((proc, log))

    async def ready() -> list[Replica]:
        out = []
        for proc, log in procs:
            port, metrics_port = await _reported_ports(log, proc)
            proc.address = f"127.0.0.1:{port}"
            await proc.wait_ready()
            out.append(Replica(proc, port, metrics_port))
        return out

    try:
        yield asyncio.run(ready())
    finally:
        for proc, _ in procs:
            proc.stop(grace=1)


def config(address: str) -> Config:
    return parse_config(
        {
            "sidecars": {"s": {"address": address, "timeout": 5}},
            "models": {"m": {"provider": "scripted", "responses": [{"text": "ok"}] * (2 * RUNS + 5)}},
            "agents": {
                "a": {"model": "m", "errorProcessorDefaults": False, "inputProcessors": ["s/pii-redactor"]}
            },
        },
        "test config",
    )


def all_of(replicas: list[Replica]) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in replicas)


async def counts(replicas: list[Replica]) -> list[float]:
    return list(await asyncio.gather(*(r.calls() for r in replicas)))


def failed_calls(app: App) -> float:
    labels = {"processor": "pii-redactor", "hook": "process_input", "outcome": "failed"}
    return app.metrics.total("procmesh_processor_calls_total", **labels)


async def generate(app: App) -> Any:
    result = await app.agent("a").generate("Mail me at a@example.com")
    assert result.error is None, result.error
    assert result.text == "ok"
    return result


async def test_runs_spread_over_every_replica(replicas: list[Replica]) -> None:
    before = await counts(replicas)
    async with App(config(all_of(replicas))) as app:
        for _ in range(RUNS):
            await generate(app)
    served = [a - b for a, b in zip(await counts(replicas), before, strict=True)]
    assert sum(served) == RUNS
    assert all(n > 0 for n in served), served  # round_robin, not pick_first


async def test_a_dns_address_works(replicas: list[Replica]) -> None:
    one = replicas[0]
    before = await one.calls()
    async with App(config(f"dns:///localhost:{one.port}")) as app:
        for _ in range(5):
            await generate(app)
    assert await one.calls() - before == 5


async def test_runs_keep_succeeding_when_a_replica_is_killed(replicas: list[Replica]) -> None:
    survivors, victim = replicas[:2], replicas[2]
    async with App(config(all_of(replicas))) as app:
        for _ in range(6):
            await generate(app)
        assert victim.process.proc is not None
        os.killpg(victim.process.proc.pid, signal.SIGKILL)
        victim.process.proc.wait()
        before = await counts(survivors)
        # concurrent runs, as under load: calls picked for the dead replica are retried on another
        await asyncio.gather(*(generate(app) for _ in range(RUNS)))
        served = [a - b for a, b in zip(await counts(survivors), before, strict=True)]
        assert sum(served) == RUNS  # every call after the kill was served by a survivor
        assert all(n > 0 for n in served), served
        assert failed_calls(app) == 0
