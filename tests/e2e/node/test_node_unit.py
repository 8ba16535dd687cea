"""The Node SDK's own unit tests (sdk/node/test, `node --test`): conversion, options, settings."""

from __future__ import annotations

import subprocess

import pytest

from procmesh_orchestrator.cli.scenario import node_command
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e


def test_node_unit_tests_pass() -> None:
    require_node()
    command = node_command(NODE_SDK / "test")
    proc = subprocess.run(
        [command[0], "--test", *command[1:]],
        cwd=NODE_SDK,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout
