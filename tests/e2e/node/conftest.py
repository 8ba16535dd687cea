"""Node SDK sidecars as real processes, started once for the whole tests/e2e/node package.

`make deps` installs Node.js and the Node SDK's packages; without them these tests fail with the
command that installs them (never a skip).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from procmesh_orchestrator.cli.scenario import node_command
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK
from tests.deps import require, require_npm_packages

HERE = Path(__file__).resolve().parent


def require_node() -> None:
    """Fail the calling test, saying how to install them, when Node.js or the SDK's packages are missing."""
    require("node")
    require_npm_packages(NODE_SDK)


def node_sidecar(script: Path, address: str, log_path: Path, *args: str) -> SidecarProcess:
    """`node SCRIPT ARGS --listen ADDRESS` as a SidecarProcess (started, not yet waited for)."""
    proc = SidecarProcess([], address, log_path=str(log_path))
    proc.args = node_command(script, *args, "--listen", address)
    proc.start()
    return proc


def wait_all(procs: Sequence[SidecarProcess]) -> None:
    """Wait until every process reports SERVING (they start in parallel)."""

    async def wait() -> None:
        await asyncio.gather(*(p.wait_ready() for p in procs))

    asyncio.run(wait())


@dataclass(frozen=True)
class Sidecars:
    """The package's long-lived sidecars: the Node SDK examples and the Python SDK examples."""

    node: str
    python: str
    dir: Path


@pytest.fixture(scope="package")
def socket_dir() -> Iterator[Path]:
    """A short directory for unix sockets (paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pmn-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="package")
def sidecars(socket_dir: Path) -> Iterator[Sidecars]:
    """`node sdk/node/examples/serve.mjs` and `python -m procmesh_sidecars examples`, on unix sockets."""
    require_node()
    node = node_sidecar(
        NODE_SDK / "examples" / "serve.mjs", f"unix://{socket_dir / 'node.sock'}", socket_dir / "node.log"
    )
    python = SidecarProcess(
        ["examples"], f"unix://{socket_dir / 'python.sock'}", log_path=str(socket_dir / "python.log")
    )
    python.start()
    try:
        wait_all([node, python])
        yield Sidecars(node.address, python.address, socket_dir)
    finally:
        node.stop(grace=2.0)
        python.stop(grace=2.0)
