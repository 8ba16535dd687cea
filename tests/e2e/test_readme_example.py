"""The README's processor and config run together as it says: the processor served as a real sidecar
process, the config as written (its address pointed at that sidecar), the `procmesh` CLI as a user
runs it. A secret in the input is a tripwire (exit 3, the processor's reason on stderr); anything else
is answered by the demo model, through the built-in sidecar the orchestrator starts for the config's
`builtins/` entry."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN, REPO

pytestmark = pytest.mark.e2e

README = (REPO / "README.md").read_text(encoding="utf-8")
ADDRESS = "127.0.0.1:50077"  # where the README serves the processor; the test's socket replaces it


def _block(language: str, after: str) -> str:
    section = README.split(after, 1)[1]
    found = re.search(rf"```{language}\n(.*?)```", section, flags=re.S)
    assert found, f"README.md has a {language} block after {after!r}"
    return found[1]


def _procmesh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "procmesh"), *args], cwd=cwd, capture_output=True, text=True, timeout=90)


async def test_the_readme_processor_and_config_run_together(tmp_path: Path) -> None:
    (tmp_path / "no_secrets.py").write_text(_block("python", "## A processor"), encoding="utf-8")
    config = _block("yaml", "## A config")
    assert ADDRESS in config
    assert "mine/no-secrets" in config
    socket = f"unix://{tmp_path / 'mine.sock'}"
    (tmp_path / "my.yaml").write_text(config.replace(ADDRESS, socket), encoding="utf-8")
    sidecar = SidecarProcess(
        [],
        socket,
        log_path=str(tmp_path / "mine.log"),
        module="no_secrets",  # `python -m no_secrets`: its `if __name__ == "__main__"` serves it
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    sidecar.start()
    try:
        await sidecar.wait_ready()
        blocked = _procmesh("stream", "assistant", "Tell me a secret", "--config", "my.yaml", cwd=tmp_path)
        assert blocked.returncode == 3, blocked.stderr
        assert "[tripwire] no-secrets: Blocked: the request mentions a secret" in blocked.stderr
        answered = _procmesh("generate", "assistant", "Hello there", "--config", "my.yaml", cwd=tmp_path)
        assert answered.returncode == 0, answered.stderr
        assert 'You said: "Hello there"' in answered.stdout
    finally:
        sidecar.stop(grace=2.0)
