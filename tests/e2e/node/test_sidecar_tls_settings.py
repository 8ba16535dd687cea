"""Both SDKs' sidecars, as real processes, refuse a client CA without a certificate and key.

``--tls-client-ca`` (``PROCMESH_TLS_CLIENT_CA``) asks for mTLS; alone it would leave the sidecar
serving plaintext to any caller, the CA never read. The orchestrator refuses the same setting
(`OrchestratorSettings`); a sidecar must not turn mTLS off silently either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from procmesh_orchestrator.cli.scenario import node_command
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e


def _command(language: str, *flags: str) -> list[str]:
    if language == "node":
        require_node()
        return node_command(NODE_SDK / "examples" / "serve.mjs", *flags)
    return [sys.executable, "-m", "procmesh_sidecars", "examples", *flags]


@pytest.mark.parametrize("language", ["node", "python"])
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_client_ca_without_a_certificate_is_refused(tmp_path: Path, language: str, how: str) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read: the sidecar must refuse before\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_TLS")}
    flags = ["--listen", "127.0.0.1:0"]
    if how == "flag":
        flags += ["--tls-client-ca", str(ca)]
    else:
        env["PROCMESH_TLS_CLIENT_CA"] = str(ca)
    done = subprocess.run(
        _command(language, *flags), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "--tls-client-ca (mTLS) needs --tls-cert and --tls-key" in done.stdout + done.stderr
