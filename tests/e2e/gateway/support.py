"""What the gateway tests share: the keys, judge sidecars started with no provider key, and the
gateway's counter read from /metrics."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK
from tests.deps import require, require_npm_packages
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEY, AUTH

GATEWAY_KEY = "gateway-key-0123456789"
"""A key with the gateway role: the one a sidecar presents to the gateway on the gRPC port."""
KEYS = f"{API_KEY}=@operator,{GATEWAY_KEY}=@gateway"
"""PROCMESH_API_KEYS of the gateway tests: the operator key the tests call with, and the sidecars'."""


def sidecar_env(gateway: str) -> dict[str, str]:
    """A sidecar's environment: the gateway's address and a gateway key, no provider key."""
    env = {k: v for k, v in os.environ.items() if "KEY" not in k and "OPENAI" not in k}
    env.update(PYTHONUNBUFFERED="1", PROCMESH_MODEL_GATEWAY=gateway, PROCMESH_MODEL_GATEWAY_KEY=GATEWAY_KEY)
    return env


def start_judge(sidecar_dir: Path, gateway: str) -> SidecarProcess:
    """``python -m tests.e2e.gateway.judge`` on a unix socket, asking the gateway at `gateway`."""
    proc = SidecarProcess(
        [],
        f"unix://{sidecar_dir / 'judge.sock'}",
        module="tests.e2e.gateway.judge",
        env=sidecar_env(gateway),
        log_path=str(sidecar_dir / "judge.log"),
    )
    proc.start()
    return proc


def start_node_judge(sidecar_dir: Path, gateway: str, script: Path, name: str) -> SidecarProcess:
    """``node <script> --listen unix://<name>.sock``: a Node SDK sidecar asking the gateway at
    `gateway`, with no provider key."""
    require("node")
    require_npm_packages(NODE_SDK)
    proc = SidecarProcess(
        [],
        f"unix://{sidecar_dir / f'{name}.sock'}",
        env=sidecar_env(gateway),
        log_path=str(sidecar_dir / f"{name}.log"),
    )
    proc.args = ["node", str(script), "--listen", proc.address]
    proc.start()
    return proc


def gateway_calls(orchestrator: OrchestratorProcess) -> dict[tuple[str, str, str], float]:
    """procmesh_gateway_calls_total by (model, processor, outcome)."""
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "procmesh_gateway_calls_total":
                labels = sample.labels
                out[(labels["model"], labels["processor"], labels["outcome"])] = sample.value
    return out


def judge_calls_saved(orchestrator: OrchestratorProcess, by: str) -> float:
    """procmesh_judge_calls_saved_total{by=`by`}, every processor's."""
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "procmesh_judge_calls_saved_total" and sample.labels["by"] == by
    )
