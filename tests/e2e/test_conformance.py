"""The public conformance scenarios, compared with compare.py through `procmesh scenario run`.

With ``--sidecar-runtime node`` the scripted processors are served by the Node SDK
(``sdk/node/scripted/serve.mjs``) instead of ``procmesh-sidecar scripted``: the result must be
the same, every scenario passes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BIN, SCENARIOS, SHARED
from tests.e2e.node.conftest import node_missing

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_every_public_scenario_matches_its_expected_trace(runtime: str) -> None:
    if runtime == "node" and (reason := node_missing()):
        pytest.skip(reason)
    if not SCENARIOS.is_dir():
        pytest.fail(f"conformance scenarios not found at {SCENARIOS} (set PROCMESH_SHARED)")
    proc = subprocess.run(
        [
            sys.executable,
            str(SHARED / "conformance" / "compare.py"),
            "--dir",
            str(SCENARIOS),
            "--runner",
            f"{BIN / 'procmesh'} scenario run --sidecar-runtime {runtime}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert summary.endswith(" 0 failed"), summary
    assert int(summary.split()[0]) >= 28, summary
