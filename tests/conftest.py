"""Shared test helpers: paths, and real sidecar processes started from the console entry points."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PROCMESH_SHARED", REPO.parent / "shared"))
SCENARIOS = SHARED / "conformance" / "scenarios"
BIN = Path(sys.executable).parent
NODE_SDK = REPO / "sdk" / "node"
# `procmesh scenario run --sidecar-runtime node` finds the Node SDK by configuration.
os.environ.setdefault("PROCMESH_NODE_SDK", str(NODE_SDK))

# The opt-in LLM tier (`make test-llm`) needs a model server; `make test` does not collect it.
collect_ignore = [] if os.environ.get("PROCMESH_LLM_BASE_URL") else ["llm"]

_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every skipped test: the suite has no skips, a missing part is a failure (make deps)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when anything was skipped, so a skip can never hide a missing component."""
    if _SKIPPED and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED:
        terminalreporter.write_line(
            f"FAILED: {len(_SKIPPED)} test(s) skipped; this suite allows none (a missing component must "
            "fail with its install hint): " + ", ".join(_SKIPPED[:10]),
            red=True,
        )


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
    (default: a unix socket in `sidecar_dir`) and module (default ``procmesh_sidecars``;
    ``tests.fixtures.faulty`` serves the failure tests' processors); call
    ``await proc.wait_ready()``.
    """
    started: list[SidecarProcess] = []

    def start(
        *args: str, address: str | None = None, name: str | None = None, module: str = "procmesh_sidecars"
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
