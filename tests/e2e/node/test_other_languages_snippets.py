"""docs/other-languages.md's Node.js snippets, as the page shows them: installed, served, checked, run.

The snippets are read from the page (tests/fixtures/snippets.py). What is changed, and only that:
fixed ports (50061) become free ones, and the conformance command runs three scenarios of the
public set instead of all of them (the full set runs in `make conformance`). A snippet that
imports `@procmesh/sdk` runs in a folder whose `node_modules/@procmesh/sdk` links to sdk/node.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK, REPO
from tests.e2e.node.conftest import require_node, wait_all
from tests.fixtures.snippets import snippet
from tests.integration.service.support import free_port

pytestmark = pytest.mark.e2e

PAGE = "docs/other-languages.md"
PAGE_PORT = "127.0.0.1:50061"
BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def check(address: str, *args: str) -> str:
    """procmesh-check-sidecar's report; fails the test unless every check passed."""
    proc = run([str(BIN / "procmesh-check-sidecar"), address, *args], REPO, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ", 0 failed, " in proc.stdout.splitlines()[-1], proc.stdout
    return proc.stdout


def sdk_dir(tmp_path: Path) -> Path:
    """A folder where `import ... from '@procmesh/sdk'` resolves to this checkout's Node SDK."""
    require_node()
    (tmp_path / "node_modules" / "@procmesh").mkdir(parents=True)
    (tmp_path / "node_modules" / "@procmesh" / "sdk").symlink_to(NODE_SDK)
    return tmp_path


@contextlib.contextmanager
def serving(work: Path, name: str, script: str) -> Iterator[str]:
    """Snippet `name` written to `script` in `work`, run as `node SCRIPT --listen ADDRESS` (as the
    page runs it) until the block ends; yields the address once it is SERVING."""
    (work / script).write_text(snippet(PAGE, name))
    address = f"127.0.0.1:{free_port()}"
    sidecar = SidecarProcess([], address, log_path=str(work / f"{script}.log"))
    sidecar.args = ["node", str(work / script), "--listen", address]
    sidecar.start()
    try:
        wait_all([sidecar])
        yield address
    finally:
        sidecar.stop()


def test_the_install_snippets_install_the_sdk_from_a_lock_and_from_a_tarball(tmp_path: Path) -> None:
    require_node()
    # `npm ci --prefix sdk/node`, from a folder holding sdk/node's package files (not the checkout's
    # own node_modules, which other tests are using).
    ci = tmp_path / "ci"
    (ci / "sdk" / "node").mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(NODE_SDK / name, ci / "sdk" / "node" / name)
    proc = run(["bash", "-euc", snippet(PAGE, "npm-ci")], ci, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (ci / "sdk" / "node" / "node_modules" / "@grpc" / "grpc-js" / "package.json").exists()

    # `npm pack` in a copy of the checkout's sdk/node (prepack reads ../../proto), then `npm install`
    # of the tarball in a project of one's own: the package loads with the contract it carries.
    pack = tmp_path / "pack"
    shutil.copytree(NODE_SDK, pack / "sdk" / "node", ignore=shutil.ignore_patterns("node_modules"))
    shutil.copytree(REPO / "proto", pack / "proto")
    tarball = Path("/tmp/procmesh-sdk-0.1.0.tgz")
    try:
        proc = run(["bash", "-euc", snippet(PAGE, "npm-pack")], pack, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert tarball.exists()
    finally:
        tarball.unlink(missing_ok=True)
    assert not (pack / "sdk" / "node" / "proto").exists()  # postpack removed its copy
    loads = run(
        ["node", "-e", "const s = require('@procmesh/sdk'); console.log(typeof s.run, typeof s.Processor)"],
        pack,
    )
    assert loads.stdout.split() == ["function", "function"], loads.stdout + loads.stderr
    # the contract it carries is every file the SDK loads: the server's and the model gateway's
    carried = pack / "node_modules" / "@procmesh" / "sdk" / "proto" / "procmesh" / "v1"
    assert sorted(p.name for p in carried.iterdir()) == ["model.proto", "processor.proto", "types.proto"]


def test_the_word_counter_passes_the_checker_and_runs_with_the_pages_config(tmp_path: Path) -> None:
    work = sdk_dir(tmp_path)
    with serving(work, "node-word-counter", "my-processors.mjs") as address:
        report = check(address)
        assert "PASS  response-validator: abort/retry encoding: ProcessOutputStep" in report, report
        (work / "that.yaml").write_text(snippet(PAGE, "node-word-counter-config").replace(PAGE_PORT, address))
        proc = run([str(BIN / "procmesh"), "generate", "a", "hello", "--config", "that.yaml"], work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"hello"' in proc.stdout, proc.stdout


def test_the_serve_snippet_binds_a_port_it_reports_and_stops_on_sigterm(tmp_path: Path) -> None:
    work = sdk_dir(tmp_path)
    (work / "serve.mjs").write_text(snippet(PAGE, "node-serve"))
    with subprocess.Popen(["node", "serve.mjs"], cwd=work, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # console.log(server.addresses), once SERVING
            found = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert found, line
            assert found[1] != "0", line
            report = check(found[0])
            assert "PASS  upper ProcessOutputStream: batches answered in order" in report, report
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_tools_snippet_serves_a_hosted_tool_the_checker_accepts(tmp_path: Path) -> None:
    with serving(sdk_dir(tmp_path), "node-tools", "tools.mjs") as address:
        report = check(address)
    assert "PASS  hosted tools: weather" in report, report
    assert "PASS  malformed ExecuteTool: unknown hosted tool: NOT_FOUND" in report, report


def test_the_conformance_command_runs_the_scenarios_on_node(tmp_path: Path) -> None:
    require_node()
    scenarios = REPO.parent / "shared" / "conformance" / "scenarios"
    picked = tmp_path / "scenarios"
    picked.mkdir()
    names = sorted(p.name for p in scenarios.glob("*.expected.json"))[:3]
    for expected in names:
        shutil.copy(scenarios / expected, picked / expected)
        shutil.copy(scenarios / expected.replace(".expected", ""), picked / expected.replace(".expected", ""))
    command = snippet(PAGE, "conformance-node").replace("../shared/conformance/scenarios", str(picked))
    assert str(picked) in command
    proc = run(["bash", "-euc", command], REPO, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3/3" in proc.stdout or "3 passed" in proc.stdout, proc.stdout
