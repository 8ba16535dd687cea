"""A key list or a trusted-context setting that could be wrong silently stops a real
``procmesh-orchestrator`` at start: exit 2, one line naming the entry, never the key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN

pytestmark = pytest.mark.e2e

SECRET = "s3cret-key-0123456789"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "config.yaml"
    path.write_text(yaml.safe_dump({"agents": {"a": {"model": "demo", "errorProcessorDefaults": False}}}))
    return path


def _start(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "procmesh-orchestrator"), "--config", str(config), "--http-port", "0", "--grpc-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PROCMESH_API_KEYS": f"k1=t1; {SECRET}=t2"}, "PROCMESH_API_KEYS entry 1 holds whitespace or ';'"),
        (
            {"PROCMESH_API_KEYS": f"{SECRET}=t1,{SECRET}=t2"},
            "PROCMESH_API_KEYS entry 2 repeats the key of entry 1",
        ),
        ({"PROCMESH_API_KEYS": f"k1=t1,k2=t2,{SECRET}"}, "PROCMESH_API_KEYS entry 3 is bound to nothing"),
        ({"PROCMESH_API_KEYS": f"{SECRET}=@admin"}, "PROCMESH_API_KEYS entry 1: unknown role '@admin'"),
        (
            {"PROCMESH_API_KEYS": f"{SECRET}=t1", "PROCMESH_TRUSTED_CONTEXT": '{"t2": ["tier"]}'},
            "PROCMESH_TRUSTED_CONTEXT entry 't2': no key of PROCMESH_API_KEYS is bound to that resource",
        ),
        (
            {"PROCMESH_API_KEYS": f"{SECRET}=t1", "PROCMESH_TRUSTED_CONTEXT": '{"t1": ["responseCache"]}'},
            "PROCMESH_TRUSTED_CONTEXT entry 't1': 'responseCache' reserved",
        ),
    ],
)
def test_a_bad_entry_stops_the_start_naming_it(config: Path, env: dict[str, str], message: str) -> None:
    done = _start(config, **env)
    assert done.returncode == 2, done.stderr
    assert f"procmesh-orchestrator: error: {message}" in done.stderr
    assert SECRET not in done.stderr + done.stdout
