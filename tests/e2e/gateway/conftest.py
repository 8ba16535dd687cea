"""What the gateway tests share: the service tests' `start_orchestrator`, a hung provider's port,
the orchestrator's gRPC port pinned before it starts, and the Python and Node judge sidecars
asking it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import start_judge, start_node_judge
from tests.e2e.service.conftest import start_orchestrator
from tests.integration.service.support import free_port

__all__ = ["gateway_port", "judge_sidecar", "node_judge", "silent_port", "start_orchestrator"]


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers: a hung provider."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def gateway_port() -> int:
    return free_port()  # the sidecar starts first, so the orchestrator's gRPC port is pinned


@pytest.fixture(scope="module")
def judge_sidecar(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    """``python -m tests.e2e.gateway.judge`` with an environment holding no provider key."""
    proc = start_judge(sidecar_dir, f"127.0.0.1:{gateway_port}")
    yield proc
    proc.stop(grace=2.0)


@pytest.fixture(scope="module")
def node_judge(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    """``node tests/e2e/gateway/judge.mjs`` (the Node SDK's `model` argument), same environment."""
    script = Path(__file__).with_name("judge.mjs")
    proc = start_node_judge(sidecar_dir, f"127.0.0.1:{gateway_port}", script, "judge-node")
    yield proc
    proc.stop(grace=2.0)
