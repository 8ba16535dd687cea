"""The public conformance scenarios, compared with compare.py through `procmesh scenario run`.

With ``--sidecar-runtime node`` the scripted processors are served by the Node SDK
(``sdk/node/scripted/serve.mjs``) instead of ``procmesh-sidecar scripted``: the result must be
the same. Two more modes run every scenario with the Python SDK again and must give the same
traces: ``--speculate`` (every scripted processor declares itself speculative, so consecutive ones
are called at once and committed in order) and ``--fuse`` (the processors the scripted sidecar
serves go in one request per hook). Scenarios that need memory (several ``calls`` on one
thread, or ``agent.memory``) run on a SQLite store in the scenario's temp folder; they are
counted apart so a regression says which side it is on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest

from tests.conftest import BIN, SCENARIOS, SHARED
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e

MODES = {
    "python": "--sidecar-runtime python",
    "node": "--sidecar-runtime node",
    "python-speculate": "--sidecar-runtime python --speculate",
    "python-fuse": "--sidecar-runtime python --fuse",
}
"""How `procmesh scenario run` runs the scenarios, by mode: each mode's traces must all match."""


def needs_memory(name: str) -> bool:
    scenario = json.loads((SCENARIOS / f"{name}.json").read_text(encoding="utf-8"))
    return "calls" in scenario or "memory" in (scenario.get("agent") or {})


@cache
def comparisons() -> dict[str, subprocess.Popen[str]]:
    """compare.py over every public scenario, one process per mode, started together: each runs
    its scenarios one after the other, so the modes share the machine's cores."""
    require_node()
    if not SCENARIOS.is_dir():
        pytest.fail(f"conformance scenarios not found at {SCENARIOS} (set PROCMESH_SHARED)")
    return {
        mode: subprocess.Popen(
            [
                sys.executable,
                str(SHARED / "conformance" / "compare.py"),
                "--dir",
                str(SCENARIOS),
                "--runner",
                f"{BIN / 'procmesh'} scenario run {flags}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, flags in MODES.items()
    }


@cache
def outcomes(mode: str) -> tuple[dict[str, str], str]:
    """One mode's comparison: {name: PASS|FAIL}, and its output for messages."""
    proc = comparisons()[mode]
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    verdicts = {}
    for line in stdout.splitlines():
        word, _, name = line.partition(" ")
        if word in ("PASS", "FAIL") and name:
            verdicts[name.strip()] = word
    expected = {p.name.removesuffix(".expected.json") for p in SCENARIOS.glob("*.expected.json")}
    assert set(verdicts) == expected, stdout[-4000:] + stderr[-2000:]
    return verdicts, stdout + stderr


@pytest.mark.timeout(900)  # compare.py runs every scenario (~40) as its own processes
@pytest.mark.parametrize("mode", MODES)
def test_every_scenario_without_memory_matches_its_expected_trace(mode: str) -> None:
    verdicts, output = outcomes(mode)
    ours = {name: word for name, word in verdicts.items() if not needs_memory(name)}
    assert len(ours) >= 28
    failed = sorted(name for name, word in ours.items() if word != "PASS")
    assert not failed, f"{failed}\n{output[-6000:]}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_every_memory_scenario_matches_its_expected_trace(mode: str) -> None:
    verdicts, output = outcomes(mode)
    memory = {name: word for name, word in verdicts.items() if needs_memory(name)}
    assert len(memory) >= 11
    failed = sorted(name for name, word in memory.items() if word != "PASS")
    assert not failed, f"{failed}\n{output[-6000:]}"
