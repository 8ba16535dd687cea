"""The Go example sidecar (examples/go), built from proto/ once per package and run as a process.

`make deps` installs Go, protoc, the two Go plugins and Debian's gRPC/protobuf Go sources; without
them these tests fail with the command that installs them (never a skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.deps import require, require_sources
from tests.e2e.node.conftest import wait_all

BUILD = REPO / "examples" / "go" / "build.sh"


def go_sidecar(binary: Path, address: str, log_path: Path, *args: str) -> SidecarProcess:
    """`go-sidecar --listen ADDRESS ARGS` as a SidecarProcess (started, not yet waited for)."""
    proc = SidecarProcess([], address, log_path=str(log_path))
    proc.args = [str(binary), "--listen", address, *args]
    proc.start()
    return proc


def run_go(
    binary: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`go-sidecar ARGS` run to its exit (an error at start), with its output; 10 s at the most."""
    return subprocess.run(
        [str(binary), *args], env=env, capture_output=True, text=True, timeout=10, check=False
    )


@pytest.fixture(scope="package")
def socket_dir() -> Iterator[Path]:
    """A short directory for unix sockets (paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pmg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="package")
def go_binary(socket_dir: Path) -> Path:
    """examples/go/build.sh, as `make go-example` runs it (the Go build cache makes a rebuild quick)."""
    for program in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc"):
        require(program)
    require_sources()
    out = socket_dir / "go-sidecar"
    proc = subprocess.run(
        ["sh", str(BUILD), str(out)], capture_output=True, text=True, timeout=540, check=False, env=os.environ
    )
    assert proc.returncode == 0, f"examples/go/build.sh failed:\n{proc.stdout}{proc.stderr}"
    return out


@pytest.fixture(scope="package")
def go_address(go_binary: Path, socket_dir: Path) -> Iterator[str]:
    """The Go sidecar, SERVING on a unix socket for the whole package."""
    proc = go_sidecar(go_binary, f"unix://{socket_dir / 'go.sock'}", socket_dir / "go.log")
    try:
        wait_all([proc])
        yield proc.address
    finally:
        proc.stop(grace=2.0)
