"""The no-skip rule: a missing program stops `make deps` (and fails its tests) with the install hint.

The bootstrap runs as a real process with a PATH that hides redis-server (and sudo); as root it
runs as `nobody` through setpriv, so that it takes the unprivileged path instead of installing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.deps import PROGRAMS, require, which

pytestmark = pytest.mark.e2e

SCRIPT = REPO / "tests" / "deps.py"


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder `nobody` can read (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="pm-deps-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def path_without(folder: Path, hidden: str) -> str:
    """A PATH of `folder`, linking every program of the table but `hidden`."""
    for name in [p.name for p in PROGRAMS if p.name != hidden]:
        found = which(name)
        assert found, f"{name} should be installed by `make deps` before this test runs"
        (folder / name).symlink_to(found)
    return str(folder)


def run_bootstrap(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The bootstrap as a user without sudo. As root, `nobody` runs a copy of it in the PATH
    folder with the base interpreter: a checkout cloned where only root can read (a home
    directory) keeps `nobody` out of both the script and the venv's python."""
    command = [sys.executable, str(SCRIPT), *args]
    if os.geteuid() == 0:
        script = Path(path) / SCRIPT.name
        shutil.copyfile(SCRIPT, script)
        script.chmod(0o644)
        command = [os.path.realpath(sys.executable), str(script), *args]
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) runs the bootstrap unprivileged"
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(
        command, env={"PATH": path, "HOME": "/tmp"}, capture_output=True, text=True, timeout=60, check=False
    )


def test_bootstrap_stops_with_the_install_command_when_redis_is_missing(folder: Path) -> None:
    proc = run_bootstrap(path_without(folder, "redis-server"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "redis-server" in proc.stderr
    assert "sudo apt-get update && sudo apt-get install -y redis-server" in proc.stderr
    assert "sudo needs a password" in proc.stderr
    assert "prometheus" not in proc.stderr  # only what is missing is named


def test_check_mode_reports_and_installs_nothing(folder: Path) -> None:
    proc = run_bootstrap(path_without(folder, "prometheus"), "--check")
    assert proc.returncode == 1
    assert "apt-get install -y prometheus" in proc.stderr
    assert "apt-get: " not in proc.stdout  # nothing was attempted


def test_with_everything_present_the_bootstrap_is_a_no_op() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""


def test_a_test_needing_a_missing_program_fails_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        pytest.fail.Exception, match=r"redis-server is not installed .*apt-get install -y redis-server"
    ):
        require("redis-server")
