"""Both SDKs' sidecars, as real processes, name a setting given that does nothing without another.

``--metrics-host`` without ``--metrics-port`` serves no metrics endpoint; a model gateway key or CA
without the gateway's address is never used. A ConfigMap shared through ``envFrom`` may set them
on purpose, so the sidecar starts, with one WARNING line per such setting naming it and why; a
sidecar whose settings all do something logs none.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procmesh_orchestrator.cli.scenario import node_command
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e

METRICS = "--metrics-host (PROCMESH_METRICS_HOST) does nothing: no --metrics-port"
KEY = "PROCMESH_MODEL_GATEWAY_KEY) does nothing: no --model-gateway"
NODE_KEY = "PROCMESH_MODEL_GATEWAY_KEY does nothing: no PROCMESH_MODEL_GATEWAY"
GATEWAY_FILES = (
    "PROCMESH_MODEL_GATEWAY_CA",
    "PROCMESH_MODEL_GATEWAY_CERT",
    "PROCMESH_MODEL_GATEWAY_CERT_KEY",
)
"""The gateway's TLS files: named too when there is no gateway to use them with."""


def _command(language: str, *flags: str) -> list[str]:
    if language == "node":
        require_node()
        return node_command(NODE_SDK / "examples" / "serve.mjs", *flags)
    return [sys.executable, "-m", "procmesh_sidecars", "examples", *flags]


def _started_log(language: str, env: dict[str, str], *flags: str, tmp_path: Path) -> str:
    """The sidecar's log once it serves (its gRPC port answers a connect), then it is stopped."""
    command = _command(language, "--listen", "127.0.0.1:0", *flags)
    return started_log(command, env, tmp_path / f"{language}.log")


def started_log(command: list[str], env: dict[str, str], log: Path) -> str:
    """`command`'s log (in `log`) once it says it serves, then it is stopped."""
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out, text=True)
        try:
            deadline = time.monotonic() + 30
            while "serving" not in log.read_text().lower():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        finally:
            process.terminate()
            process.wait(timeout=30)
    return log.read_text()


def _environment(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}
    return {**env, **more}


@pytest.mark.parametrize("language", ["node", "python"])
def test_a_metrics_host_without_a_port_and_a_key_without_a_gateway_are_warned(
    tmp_path: Path, language: str
) -> None:
    files = {name: str(tmp_path / f"{name.lower()}.pem") for name in GATEWAY_FILES}  # never read
    env = _environment(PROCMESH_MODEL_GATEWAY_KEY="k-1", **files)
    flags = ("--metrics-host", "127.0.0.1") if language == "python" else ()
    if language == "node":
        env["PROCMESH_METRICS_HOST"] = "127.0.0.1"
    text = _started_log(language, env, *flags, tmp_path=tmp_path)
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    assert any(METRICS in line for line in warnings), text
    assert any((NODE_KEY if language == "node" else KEY) in line for line in warnings), text
    for name in GATEWAY_FILES:
        said = (
            f"{name} does nothing: no PROCMESH_MODEL_GATEWAY"
            if language == "node"
            else f"{name}) does nothing"
        )
        assert any(said in line for line in warnings), (name, text)
    assert "k-1" not in text  # the key's name, never its value


@pytest.mark.parametrize("language", ["node", "python"])
def test_settings_that_all_do_something_are_not_warned(tmp_path: Path, language: str) -> None:
    env = _environment(PROCMESH_MODEL_GATEWAY="127.0.0.1:1", PROCMESH_MODEL_GATEWAY_KEY="k-1")
    text = _started_log(
        language, env, "--metrics-port", "0", "--metrics-host", "127.0.0.1", tmp_path=tmp_path
    )
    assert "does nothing" not in text, text
