"""A real Prometheus server scrapes a running orchestrator and sidecar with deploy/prometheus/prometheus.yml.

The test runs three agent calls (a plain run, a tripwire, a retry with feedback), lets
Prometheus (Debian package ``prometheus``; .ci/run installs it) scrape every second, and
asserts through Prometheus's HTTP query API that the series exist with the right labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.deps import require
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, SECRET, free_port, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DEPLOY_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
ORCHESTRATOR_JOB = "procmesh-orchestrator"
SIDECAR_JOB = "procmesh-sidecars"


def scrape_config(orchestrator: str, sidecar: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with a 1 s interval and this test's targets."""
    config: dict[str, Any] = yaml.safe_load(DEPLOY_CONFIG.read_text(encoding="utf-8"))
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    targets = {ORCHESTRATOR_JOB: orchestrator, SIDECAR_JOB: sidecar}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == sorted(targets), "the test and deploy/prometheus disagree on the jobs"
    for name, target in targets.items():
        for static in jobs[name]["static_configs"]:
            static["targets"] = [target]
    # The alert rules live beside the deploy file; the test's copy lives elsewhere.
    config["rule_files"] = [str(DEPLOY_CONFIG.parent / path) for path in config.get("rule_files", [])]
    return config


def launch_prometheus(
    binary: str, config: Path, data: Path, web: str, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start the Prometheus binary (not the package's service) on `web`, logging to `log_path`."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address={web}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_prometheus(proc: subprocess.Popen[bytes], workdir: Path) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.client = httpx.AsyncClient(base_url=url, timeout=10)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        response = await self.client.get("/api/v1/query", params={"query": promql})
        body = response.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def labels(self, promql: str) -> list[dict[str, str]]:
        return [series["metric"] for series in await self.query(promql)]

    async def value(self, promql: str) -> float:
        result = await self.query(promql)
        assert len(result) == 1, (promql, result)
        return float(result[0]["value"][1])


def examples_with_metrics(
    start_sidecar: Callable[..., SidecarProcess], name: str
) -> tuple[SidecarProcess, int]:
    """The `examples` sidecar serving its metrics on a free port (started, not yet waited for)."""
    port = free_port()
    return start_sidecar("examples", "--metrics-port", str(port), name=name), port


@contextlib.asynccontextmanager
async def running_prometheus(
    binary: str,
    orchestrator: OrchestratorProcess,
    sidecar_metrics_port: int,
    workdir: Path,
    wait: float = 30.0,
) -> AsyncIterator[tuple[Prometheus, float]]:
    """Prometheus scraping `orchestrator` and the sidecar metrics port with the deploy file
    (scrape_config), ready; yields it and the monotonic deadline `wait` s from its start."""
    config_path = workdir / "prometheus.yml"
    host, port = orchestrator.http_url.removeprefix("http://").split(":")
    config = scrape_config(f"{host}:{port}", f"127.0.0.1:{sidecar_metrics_port}")
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    web = f"127.0.0.1:{free_port()}"
    log_path = workdir / "prometheus.log"
    proc = await asyncio.to_thread(launch_prometheus, binary, config_path, workdir / "data", web, log_path)
    server = Prometheus(f"http://{web}")
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                if (await server.client.get("/-/ready")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "Prometheus not ready:\n" + log_path.read_text()
            await asyncio.sleep(0.2)
        yield server, deadline
    finally:
        await server.client.aclose()
        await asyncio.to_thread(stop_prometheus, proc, workdir)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prometheus(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Prometheus]:
    binary = require("prometheus")
    sidecar, metrics_port = examples_with_metrics(start_sidecar, "prom-guards")
    await sidecar.wait_ready()
    orchestrator = await asyncio.to_thread(
        start_orchestrator, service_config({"guards": sidecar.address}), env={"PROCMESH_API_KEYS": API_KEYS}
    )
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        calls = [
            ("assistant", f"hello {SECRET}"),  # ok
            ("assistant", f"jailbreak {SECRET}"),  # tripwire in process_input
            ("concise", "hello"),  # length-check asks for a retry once
        ]
        for agent, text in calls:
            response = await http.post(f"/api/agents/{agent}/generate", json={"messages": text})
            assert response.status_code == 200

    workdir = tmp_path_factory.mktemp("prometheus")
    async with running_prometheus(binary, orchestrator, metrics_port, workdir) as (server, deadline):
        # Wait until a scrape of both targets has landed the series we need.
        while not (
            await server.query(f'procmesh_retries_total{{job="{ORCHESTRATOR_JOB}"}}')
            and await server.query(f'procmesh_sidecar_hook_calls_total{{job="{SIDECAR_JOB}"}}')
        ):
            assert time.monotonic() < deadline, "no scrape in time"
            await asyncio.sleep(0.5)
        yield server


async def test_both_targets_are_up(prometheus: Prometheus) -> None:
    assert await prometheus.value(f'up{{job="{ORCHESTRATOR_JOB}"}}') == 1
    assert await prometheus.value(f'up{{job="{SIDECAR_JOB}"}}') == 1


async def test_processor_calls_are_counted_by_processor_hook_and_outcome(prometheus: Prometheus) -> None:
    series = await prometheus.labels(f'procmesh_processor_calls_total{{job="{ORCHESTRATOR_JOB}"}}')
    keys = {(s["processor"], s["hook"], s["outcome"]) for s in series}
    assert ("topic-guard", "process_input", "ok") in keys
    assert ("topic-guard", "process_input", "abort") in keys
    assert ("length-check", "process_output_step", "abort") in keys  # the retry request
    assert ("length-check", "process_output_step", "ok") in keys
    assert all(s["component"] == "orchestrator" for s in series)  # the deploy file's target labels


async def test_processor_latency_histograms(prometheus: Prometheus) -> None:
    # The same hook call timed on both sides: the orchestrator (network included) and the sidecar.
    orchestrator_histogram = await prometheus.labels(
        f'procmesh_processor_call_duration_seconds_bucket{{job="{ORCHESTRATOR_JOB}",processor="topic-guard"}}'
    )
    assert {s["hook"] for s in orchestrator_histogram} == {"process_input"}
    assert "+Inf" in {s["le"] for s in orchestrator_histogram}
    hook_buckets = await prometheus.labels(
        'procmesh_sidecar_hook_duration_seconds_bucket{processor="topic-guard",hook="process_input"}'
    )
    assert {s["job"] for s in hook_buckets} == {SIDECAR_JOB}
    assert "+Inf" in {s["le"] for s in hook_buckets}
    calls = await prometheus.value(
        'procmesh_sidecar_hook_duration_seconds_count{processor="topic-guard",hook="process_input"}'
    )
    assert calls == 2
    median = await prometheus.query(
        'histogram_quantile(0.5, procmesh_sidecar_hook_duration_seconds_bucket{processor="topic-guard"})'
    )
    assert median
    assert 0 < float(median[0]["value"][1]) < 5
    run_buckets = await prometheus.labels('procmesh_run_duration_seconds_bucket{agent="assistant"}')
    assert "+Inf" in {s["le"] for s in run_buckets}


async def test_tripwires_retries_and_runs(prometheus: Prometheus) -> None:
    assert (
        await prometheus.value('procmesh_tripwires_total{processor="topic-guard",hook="process_input"}') == 1
    )
    assert await prometheus.value('procmesh_retries_total{kind="step"}') == 1
    runs = {
        (s["metric"]["agent"], s["metric"]["finish_reason"]): float(s["value"][1])
        for s in await prometheus.query("procmesh_runs_total")
    }
    assert runs == {("assistant", "stop"): 1, ("assistant", "other"): 1, ("concise", "stop"): 1}


async def test_sidecar_hook_calls_by_processor_hook_and_outcome(prometheus: Prometheus) -> None:
    series = await prometheus.query(f'procmesh_sidecar_hook_calls_total{{job="{SIDECAR_JOB}"}}')
    counts = {
        (s["metric"]["processor"], s["metric"]["hook"], s["metric"]["outcome"]): s["value"][1] for s in series
    }
    assert counts[("topic-guard", "process_input", "ok")] == "1"
    assert counts[("topic-guard", "process_input", "abort")] == "1"
    assert ("length-check", "process_output_step", "abort") in counts


async def test_no_label_holds_user_content(prometheus: Prometheus) -> None:
    series = await prometheus.labels('{__name__=~"procmesh_.+"}')
    assert len(series) > 20
    assert not [s for s in series if any(SECRET in value for value in s.values())]
