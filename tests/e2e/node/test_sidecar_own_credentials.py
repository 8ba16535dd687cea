"""A Node sidecar program that passes its own ``credentials`` to ``run()`` serves with them, never
with ``--tls-cert`` / ``--tls-key`` / ``--tls-client-ca`` (``PROCMESH_TLS_*``): a real process
started with those variables set names each in a start-up WARNING (it used to start without a
word, an operator believing it served the TLS the variables describe)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from procmesh_orchestrator.cli.scenario import node_command
from tests.e2e.node.conftest import HERE, require_node
from tests.e2e.node.test_sidecar_idle_settings import started_log

pytestmark = pytest.mark.e2e

VARIABLES = {
    "--tls-cert": "PROCMESH_TLS_CERT",
    "--tls-key": "PROCMESH_TLS_KEY",
    "--tls-client-ca": "PROCMESH_TLS_CLIENT_CA",
}


def _log(tmp_path: Path, script: Path, **tls: str) -> str:
    require_node()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}
    return started_log(node_command(script, "--listen", "127.0.0.1:0"), {**env, **tls}, tmp_path / "node.log")


def test_tls_variables_a_programs_own_credentials_override_are_warned(tmp_path: Path) -> None:
    pem = tmp_path / "unused.pem"
    pem.write_text("never read: the program's credentials serve\n")
    text = _log(tmp_path, HERE / "own_credentials.mjs", **dict.fromkeys(VARIABLES.values(), str(pem)))
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    for flag, variable in VARIABLES.items():
        expected = f"{flag} ({variable}) is ignored: the program passes its own credentials"
        assert any(expected in line for line in warnings), text
    assert str(pem) not in text  # named, not its value


def test_own_credentials_without_tls_variables_are_not_warned(tmp_path: Path) -> None:
    text = _log(tmp_path, HERE / "own_credentials.mjs")
    assert "is ignored" not in text, text
