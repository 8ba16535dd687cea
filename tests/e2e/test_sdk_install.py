"""`pip install ./sdk` into an empty venv is all a processor author (in any language) needs.

The SDK is built and installed like a user would (a wheel, its dependencies from the package
index), then used from outside the repository, so nothing of the working tree leaks in: the
venv must have `procmesh` and the `procmesh-check-sidecar` script, and no top-level
`orchestrator` or `sidecars` package (nor the repo's other two distributions).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def _run(cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH and a cwd outside the repo: the venv sees only what pip installed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=90, check=False)


def test_the_sdk_installs_alone_into_an_empty_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    made = _run(tmp_path, sys.executable, "-m", "venv", str(venv))
    assert made.returncode == 0, made.stderr
    pip = _run(
        tmp_path,
        str(venv / "bin" / "pip"),
        "install",
        "--quiet",
        "--disable-pip-version-check",
        str(REPO / "sdk"),
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr

    usage = _run(tmp_path, str(venv / "bin" / "procmesh-check-sidecar"), "--help")
    assert usage.returncode == 0, usage.stderr
    assert usage.stdout.startswith("usage: procmesh-check-sidecar ")

    probe = (
        "import importlib.util, pathlib, procmesh, procmesh.check\n"
        "print(pathlib.Path(procmesh.__file__).resolve())\n"
        "for name in ('orchestrator', 'sidecars', 'procmesh_orchestrator', 'procmesh_sidecars'):\n"
        "    print(name, importlib.util.find_spec(name) is not None)\n"
    )
    out = _run(tmp_path, str(venv / "bin" / "python"), "-c", probe)
    assert out.returncode == 0, out.stderr
    location, *found = out.stdout.splitlines()
    assert Path(location).is_relative_to(venv.resolve()), location  # a wheel install, not the tree
    assert found == [
        "orchestrator False",
        "sidecars False",
        "procmesh_orchestrator False",
        "procmesh_sidecars False",
    ]
