"""The package's tool sidecars, real processes started once: the Python fixture and the Node one.

A test that kills its sidecar starts its own (`own_sidecar`); every other test shares these.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import node_sidecar, require_node

PY_TOOLS = "tests.fixtures.tool_sidecar"
NODE_TOOLS = REPO / "tests" / "fixtures" / "node_tools.js"


@pytest.fixture(scope="package")
def socket_dir() -> Iterator[Path]:
    """A short directory for unix sockets (paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pmt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="package")
def py_tools(socket_dir: Path) -> Iterator[str]:
    """The address of `python -m tests.fixtures.tool_sidecar`."""
    proc = SidecarProcess(
        [], f"unix://{socket_dir / 'py.sock'}", log_path=str(socket_dir / "py.log"), module=PY_TOOLS
    )
    proc.start()
    try:
        asyncio.run(proc.wait_ready())
        yield proc.address
    finally:
        proc.stop(grace=2.0)


@pytest.fixture(scope="package")
def node_tools(socket_dir: Path) -> Iterator[str]:
    """The address of `node tests/fixtures/node_tools.js` (Node.js and the SDK's packages: make deps)."""
    require_node()
    proc = node_sidecar(NODE_TOOLS, f"unix://{socket_dir / 'node.sock'}", socket_dir / "node.log")
    try:
        asyncio.run(proc.wait_ready())
        yield proc.address
    finally:
        proc.stop(grace=2.0)


_own = itertools.count()


@pytest_asyncio.fixture
async def own_sidecar(socket_dir: Path) -> AsyncIterator[Callable[[], SidecarProcess]]:
    """Start Python tool sidecars of the test's own (it may kill them); stopped after the test."""
    started: list[SidecarProcess] = []

    def start() -> SidecarProcess:
        name = f"own{next(_own)}"
        proc = SidecarProcess(
            [],
            f"unix://{socket_dir / (name + '.sock')}",
            log_path=str(socket_dir / f"{name}.log"),
            module=PY_TOOLS,
        )
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(grace=2.0)
