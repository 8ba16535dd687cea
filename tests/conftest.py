"""Shared test helpers: paths, and real sidecar processes started from the console entry points."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PROCMESH_SHARED", REPO.parent / "shared"))
SCENARIOS = SHARED / "conformance" / "scenarios"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def sidecar_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short directory for unix sockets (paths must stay under ~100 bytes)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pm-"))
    yield path  # type: ignore[misc]
    for child in path.iterdir():
        child.unlink(missing_ok=True)
    path.rmdir()


@pytest.fixture(scope="module")
def start_sidecar(sidecar_dir: Path) -> Iterator[Callable[..., SidecarProcess]]:
    """Start `python -m MODULE ARGS --listen ADDRESS` as a real process; stopped at module end.

    The returned function takes the sidecar arguments, an optional address
    (default: a unix socket in `sidecar_dir`) and module (default ``sidecars``;
    ``tests.fixtures.faulty`` serves the failure tests' processors); call
    ``await proc.wait_ready()``.
    """
    started: list[SidecarProcess] = []

    def start(
        *args: str, address: str | None = None, name: str | None = None, module: str = "sidecars"
    ) -> SidecarProcess:
        name = name or f"s{len(started)}"
        addr = address or f"unix://{sidecar_dir / (name + '.sock')}"
        proc = SidecarProcess(list(args), addr, log_path=str(sidecar_dir / f"{name}.log"), module=module)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(grace=2.0)
