"""proto/README.md's Node.js processor, as the page shows it: checked by its CI recipe, run in a pipeline.

The snippets are read from the page (tests/fixtures/snippets.py) and written to files; the only
change is the port (50061 on the page, a free one here). `shout.js` finds its npm packages
through a `node_modules` link to the Node SDK's (the page's `npm install` names the same three).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK, REPO
from tests.e2e.node.conftest import require_node, wait_all
from tests.fixtures.snippets import snippet
from tests.integration.service.support import free_port

pytestmark = pytest.mark.e2e

PAGE = "proto/README.md"
PAGE_PORT = "127.0.0.1:50061"
BIN = Path(sys.executable).parent


def shout_dir(tmp_path: Path) -> Path:
    """A folder holding the page's shout.js, its packages and the contract (`proto/`)."""
    require_node()
    (tmp_path / "shout.js").write_text(snippet(PAGE, "node-shout"))
    (tmp_path / "node_modules").symlink_to(NODE_SDK / "node_modules")
    (tmp_path / "proto").symlink_to(REPO / "proto")
    return tmp_path


def test_the_ci_recipe_installs_the_checker_alone_and_the_node_processor_passes(tmp_path: Path) -> None:
    work = shout_dir(tmp_path)
    # The recipe runs from a checkout: `./sdk` is the Python SDK's folder (copied: pip builds in it).
    shutil.copytree(REPO / "sdk", work / "sdk", ignore=shutil.ignore_patterns("node", "__pycache__"))
    address = f"127.0.0.1:{free_port()}"
    recipe = snippet(PAGE, "check-in-ci").replace(PAGE_PORT, address)
    assert address in recipe
    proc = subprocess.run(
        ["bash", "-c", recipe], cwd=work, capture_output=True, text=True, timeout=240, check=False
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert (work / "checker" / "bin" / "procmesh-check-sidecar").exists()
    lines = out.splitlines()
    assert lines[-1].startswith("15 passed, 0 failed"), out
    for check in (
        "malformed ProcessOutputStream: empty processor_id: INVALID_ARGUMENT",
        "malformed ProcessOutputStream: unknown processor: NOT_FOUND",
        # grpc-js answers bytes it cannot parse before the handler runs: INTERNAL, which passes.
        "malformed ProcessOutputStream: corrupt bytes: INTERNAL",
        "shout ProcessOutputStream: batches answered in order",
        "shout ProcessOutputStream: StreamEnd",
        "shout ProcessOutputStream: unchanged runs",  # it upper-cases every delta: only the data part
        "shout: state round-trip",
        "shout: deadline respected",
    ):
        assert any(line.startswith("PASS") and check in line for line in lines), (check, out)


def test_the_node_processor_upper_cases_a_stream_with_the_pages_config(tmp_path: Path) -> None:
    work = shout_dir(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    # shout.js reads the contract from PROTO_DIR (default `proto`, relative to where it runs).
    env = {**os.environ, "PROTO_DIR": str(work / "proto")}
    sidecar = SidecarProcess([], address, log_path=str(work / "shout.log"), env=env)
    sidecar.args = ["node", str(work / "shout.js"), address]
    sidecar.start()
    try:
        wait_all([sidecar])
        (work / "that.yaml").write_text(snippet(PAGE, "node-shout-config").replace(PAGE_PORT, address))
        proc = subprocess.run(
            [str(BIN / "procmesh"), "stream", "a", "hello", "--config", "that.yaml"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        sidecar.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The demo model quotes the input; every streamed letter passed shout.
    assert '"HELLO"' in proc.stdout, proc.stdout
    assert not any(c.islower() for c in proc.stdout), proc.stdout
