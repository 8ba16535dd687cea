"""Sidecars in both languages expose the same series: a dashboard need not know the language.

A Node SDK sidecar and a Python SDK sidecar, each with a metrics port, serve the same run (their
``word-counter`` processors, one per language); both scrapes must hold the SDK's families with
the same label names and values for the hook, plus process and build-info series, and no
``_created`` series.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import node_sidecar, require_node, wait_all

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SDK_FAMILIES = {
    "procmesh_sidecar_hook_calls": ("counter", {"processor", "hook", "outcome"}),
    "procmesh_sidecar_hook_duration_seconds": ("histogram", {"processor", "hook"}),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def metered(socket_dir: Path) -> Iterator[dict[str, tuple[str, int]]]:
    require_node()
    ports = {"node": free_port(), "python": free_port()}
    node = node_sidecar(
        NODE_SDK / "examples" / "serve.mjs",
        f"unix://{socket_dir / 'metered-node.sock'}",
        socket_dir / "metered-node.log",
        "--metrics-port",
        str(ports["node"]),
    )
    python = SidecarProcess(
        ["examples", "--metrics-port", str(ports["python"])],
        f"unix://{socket_dir / 'metered-python.sock'}",
        log_path=str(socket_dir / "metered-python.log"),
    )
    python.start()
    try:
        wait_all([node, python])
        yield {"node": (node.address, ports["node"]), "python": (python.address, ports["python"])}
    finally:
        node.stop(grace=2.0)
        python.stop(grace=2.0)


async def scrape(port: int) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    return response.text


async def test_both_sdks_expose_the_same_series(metered: dict[str, tuple[str, int]]) -> None:
    config = parse_config(
        {
            "sidecars": {name: {"address": address} for name, (address, _) in metered.items()},
            "models": {"scripted": {"provider": "scripted", "responses": [{"text": "one two three"}]}},
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "outputProcessors": [
                        {"processor": "node/word-counter", "name": "word-counter-node"},
                        {"processor": "python/word-counter", "name": "word-counter-python"},
                    ],
                }
            },
        },
        "metrics test config",
    )
    async with App(config) as app:
        result = await app.agent("a").generate("hi")
    assert result.error is None

    seen: dict[str, dict[str, set[str]]] = {}
    hooks: dict[str, set[str]] = {}
    for language, (_, port) in metered.items():
        text = await scrape(port)
        assert "_created" not in text, language
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name, (kind, labels) in SDK_FAMILIES.items():
            family = families[name]
            assert family.type == kind, (language, name)
            samples = [s for s in family.samples if s.labels.get("processor") == "word-counter"]
            assert samples, (language, name)
            seen.setdefault(name, {})[language] = set(samples[0].labels) - {"le"}
            assert seen[name][language] == labels, (language, name)
            hooks.setdefault(language, set()).update(s.labels["hook"] for s in samples)
        assert any(s.value for s in families["procmesh_sidecar_hook_calls"].samples), language
        # Python's Info and Node's gauge: the same sample, procmesh_sidecar_build_info{...} 1.
        [build] = [s for f in families.values() for s in f.samples if s.name == "procmesh_sidecar_build_info"]
        assert build.value == 1
        assert set(build.labels) == {"sdk", "version", "runtime", "grpc"}
        assert build.labels["sdk"] == language
        assert "process_cpu_seconds" in families, language
        assert "process_start_time_seconds" in families, language
    # Hook label values are the proto's snake_case names in both languages.
    assert hooks["node"] == hooks["python"]
    assert "process_output_result" in hooks["node"]
