"""The guards' sidecar (`procmesh-sidecar guards`, no provider key in its environment) and the
gateway port it is told about; the service tests' `start_orchestrator` starts the orchestrator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import sidecar_env
from tests.e2e.service.conftest import start_orchestrator
from tests.integration.service.support import free_port

__all__ = ["gateway_port", "guards_process", "guards_sidecar", "start_orchestrator"]


@pytest.fixture(scope="module")
def gateway_port() -> int:
    return free_port()  # the sidecar starts first, so the orchestrator's gRPC port is pinned


def guards_process(sidecar_dir: Path, gateway_port: int, name: str) -> Iterator[SidecarProcess]:
    """``procmesh-sidecar guards`` on ``<name>.sock``, its environment holding the gateway and no
    provider key (started, yielded, stopped)."""
    proc = SidecarProcess(
        ["guards"],
        f"unix://{sidecar_dir / f'{name}.sock'}",
        env=sidecar_env(f"127.0.0.1:{gateway_port}"),
        log_path=str(sidecar_dir / f"{name}.log"),
    )
    proc.start()
    yield proc
    proc.stop(grace=2.0)


@pytest.fixture(scope="module")
def guards_sidecar(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    """``procmesh-sidecar guards``, its environment holding the gateway and no provider key."""
    yield from guards_process(sidecar_dir, gateway_port, "guards")
