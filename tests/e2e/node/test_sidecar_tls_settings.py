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


@pytest.mark.parametrize("language", ["node", "python"])
@pytest.mark.parametrize("where", ["under-a-file", "path-too-long"])
def test_a_unix_socket_that_cannot_be_made_is_one_line_and_exit_2(
    tmp_path: Path, language: str, where: str
) -> None:
    """As a TCP address that cannot be bound: one line naming the address and the system's reason,
    exit 2 (both SDKs printed a stack and exited 1; Node's gRPC took a path too long for a socket
    and served nowhere, the chmod after it failing)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "s.sock" if where == "under-a-file" else tmp_path / ("x" * 120 + ".sock")
    address = f"unix://{path}"
    done = subprocess.run(
        _command(language, "--listen", address), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"cannot listen on {address}: " in last, done.stderr
