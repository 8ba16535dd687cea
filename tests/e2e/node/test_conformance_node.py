"""The public conformance scenarios with their scripted processors served by the Node SDK.

`procmesh scenario run --sidecar-runtime node` starts ``node sdk/node/scripted/serve.mjs``
(the scenario rule language in JavaScript) instead of ``procmesh-sidecar scripted``; compare.py
must give the same result as with the Python runtime (tests/e2e/test_conformance.py): every
scenario passes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BIN, SCENARIOS, SHARED
from tests.e2e.node.conftest import node_missing

pytestmark = pytest.mark.e2e


def test_every_public_scenario_matches_its_expected_trace_with_node_sidecars() -> None:
    reason = node_missing()
    if reason:
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
            f"{BIN / 'procmesh'} scenario run --sidecar-runtime node",
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
