"""The guards' sidecar (`procmesh-sidecar guards`, no provider key in its environment) and the
gateway port it is told about; the service tests' `start_orchestrator` starts the orchestrator.

`orchestrator` starts, for a module whose `replica` fixture says what (support.Replica), a guards
sidecar of its own and the orchestrator whose gateway it calls (support.start_replica): the way
for a module whose orchestrator has one guards sidecar. A module that needs several sidecars on
one gateway (test_merged_judge.py, test_merged_judge_trace.py) or the sidecar process itself
(support's guards world: test_guards.py and test_guards_judging.py read its Describe and its
environment) starts them from `gateway_port`, `guards_sidecar` and `guards_process` and overrides
`orchestrator`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.guards.support import Replica, guards_sidecar_process, start_replica
from tests.e2e.service.conftest import OrchestratorProcess, start_orchestrator
from tests.integration.service.support import free_port

__all__ = ["gateway_port", "guards_process", "guards_sidecar", "orchestrator", "start_orchestrator"]


@pytest.fixture(scope="module")
def gateway_port() -> int:
    return free_port()  # the sidecar starts first, so the orchestrator's gRPC port is pinned


def guards_process(sidecar_dir: Path, gateway_port: int, name: str) -> Iterator[SidecarProcess]:
    """``procmesh-sidecar guards`` on ``<name>.sock``, its environment holding the gateway and no
    provider key (started, yielded, stopped)."""
    proc = guards_sidecar_process(sidecar_dir, gateway_port, name)
    proc.start()
    yield proc
    proc.stop(grace=2.0)


@pytest.fixture(scope="module")
def guards_sidecar(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    """``procmesh-sidecar guards``, its environment holding the gateway and no provider key."""
    yield from guards_process(sidecar_dir, gateway_port, "guards")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    replica: Replica, sidecar_dir: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> AsyncIterator[OrchestratorProcess]:
    """The orchestrator of the module's `replica`, its own guards sidecar stopped after it."""
    sidecar, started = await start_replica(
        sidecar_dir, replica.name, replica.config, start_orchestrator, replica.env
    )
    yield started
    sidecar.stop(grace=2.0)
