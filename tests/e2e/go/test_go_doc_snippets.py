"""docs/other-languages.md's Go and checker snippets, as the page shows them.

The snippets are read from the page (tests/fixtures/snippets.py). What is changed, and only that:
the binary's path (the package's build of examples/go, the one `make go-example` writes to
examples/go/build/go-sidecar) and the socket (/tmp/procmesh-go.sock on the page, a private one
here). The stream loop is a sketch of examples/go/service.go's, so it is syntax-checked (gofmt
parses it inside a function), not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import wait_all
from tests.fixtures.snippets import snippet

pytestmark = pytest.mark.e2e

PAGE = "docs/other-languages.md"
PAGE_SOCKET = "unix:///tmp/procmesh-go.sock"
PAGE_BINARY = "examples/go/build/go-sidecar"
BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`cmd` with the project's venv first on PATH (where `make install` puts the commands)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def test_the_go_sidecar_runs_as_shown_passes_the_pages_check_and_guards_a_run(
    go_binary: Path, socket_dir: Path
) -> None:
    address = f"unix://{socket_dir / 'doc-go.sock'}"
    command = snippet(PAGE, "go-run").split("#")[0].replace(PAGE_SOCKET, address)
    args = shlex.split(command)
    assert args[0] == PAGE_BINARY
    sidecar = SidecarProcess([], address, log_path=str(socket_dir / "doc-go.log"))
    sidecar.args = [str(go_binary), *args[1:]]
    sidecar.start()
    try:
        wait_all([sidecar])
        checked = run(["bash", "-euc", snippet(PAGE, "go-check").replace(PAGE_SOCKET, address)], REPO)
        config = socket_dir / "doc-go.yaml"
        config.write_text(snippet(PAGE, "go-config").replace(PAGE_SOCKET, address))
        guarded = run(
            [str(BIN / "procmesh"), "generate", "a", "please jailbreak it", "--config", str(config)], REPO
        )
        shouted = run([str(BIN / "procmesh"), "generate", "a", "hello", "--config", str(config)], REPO)
    finally:
        sidecar.stop(grace=2.0)
    # The page's `procmesh-check-sidecar` line (on PATH: the venv's) passes, both guards aborting.
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (
        "PASS  word-guard: abort/retry encoding: ProcessInput: reason 'blocked word: jailbreak'"
        in checked.stdout
    )
    assert "PASS  shout: abort/retry encoding: ProcessOutputStream" in checked.stdout
    # The page's config: word-guard stops the run, shout upper-cases the other one's answer.
    assert "blocked word: jailbreak" in guarded.stdout + guarded.stderr, guarded
    assert shouted.returncode == 0, shouted.stdout + shouted.stderr
    assert '"HELLO"' in shouted.stdout, shouted.stdout


def test_the_stream_loop_sketch_parses_as_go(tmp_path: Path) -> None:
    body = snippet(PAGE, "go-stream-loop")
    source = tmp_path / "loop.go"
    source.write_text("package sketch\n\nfunc loop() error {\n" + body + "}\n")
    proc = run(["gofmt", "-e", str(source)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # What it sketches is there in the example: the same calls, in the same order.
    service = (REPO / "examples" / "go" / "service.go").read_text()
    calls = [
        "stream.Recv()",
        "io.EOF",
        "copyState(req.GetContext().GetState())",
        "stream.Send(",
        "End: &pb.StreamEnd",
    ]
    assert [service.index(c) for c in calls] == sorted(service.index(c) for c in calls)
    assert all(c in body for c in calls)


def test_the_checker_installs_from_sdk_alone_and_takes_the_synopsis_flags(tmp_path: Path) -> None:
    install, synopsis = snippet(PAGE, "checker-usage").splitlines()[:2]
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    # `pip install ./sdk` from the repository's root, with the fresh venv's pip.
    proc = run(["bash", "-euc", f"{venv}/bin/{install.split('#')[0]}"], REPO, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    help_text = run([str(venv / "bin" / "procmesh-check-sidecar"), "--help"], tmp_path).stdout
    flags = re.findall(r"--[a-z-]+", synopsis)
    assert flags == ["--processor", "--options", "--timeout", "--wait"]
    assert all(flag in help_text for flag in flags), help_text
