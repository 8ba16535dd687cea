"""The Go example checks its PROCMESH_* variables at start as the SDKs do (docs/running.md).

A name no procmesh component reads stops it (exit status 2) naming the name and the closest known
one; another component's variables (a ConfigMap shared through envFrom) are named in one log line
and not read; its own two (PROCMESH_LISTEN, PROCMESH_GRACE_SECONDS) are read.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from procmesh.environment import COMPONENTS
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.go.conftest import run_go
from tests.e2e.node.conftest import wait_all

pytestmark = pytest.mark.e2e

OWN = {"PROCMESH_LISTEN", "PROCMESH_GRACE_SECONDS"}


def _environ(**variables: str) -> dict[str, str]:
    """This process's environment without its PROCMESH_* variables, plus `variables`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")} | variables


def test_an_unknown_variable_stops_it_at_start_naming_it_and_the_closest_name(go_binary: Path) -> None:
    env = _environ(PROCMESH_LISTN="127.0.0.1:1", PROCMESH_GRACE_SECOND="1", PROCMESH_CONFIG="c.yaml")
    proc = run_go(go_binary, "--listen", "127.0.0.1:0", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "go-sidecar: error: unknown environment variables PROCMESH_CONFIG (renamed "
        "PROCMESH_CONFIG_FILE), PROCMESH_GRACE_SECOND (did you mean PROCMESH_GRACE_SECONDS?), "
        "PROCMESH_LISTN (did you mean PROCMESH_LISTEN?): no procmesh component reads them (unset it, "
        "or fix its name; the variables are listed in docs/running.md)"
    )
    bad = run_go(go_binary, env=_environ(PROCMESH_GRACE_SECONDS="soon"))
    assert bad.returncode == 2
    assert 'PROCMESH_GRACE_SECONDS="soon" is not a number of seconds' in bad.stderr


def test_other_components_variables_are_named_and_not_read_and_its_own_are_read(
    go_binary: Path, socket_dir: Path
) -> None:
    foreign = sorted(
        set().union(*COMPONENTS.values()) - OWN
        | {"PROCMESH_CONFIG__AGENTS__A__MAX_STEPS", "PROCMESH_TEST_DSN"}
    )
    sock = socket_dir / "env.sock"
    log = socket_dir / "env.log"
    env = _environ(
        **dict.fromkeys(foreign, "x"), PROCMESH_LISTEN=f"unix://{sock}", PROCMESH_GRACE_SECONDS="0.25"
    )
    proc = SidecarProcess([], f"unix://{sock}", log_path=str(log), env=env)
    proc.args = [str(go_binary)]  # no --listen: the address comes from PROCMESH_LISTEN
    proc.start()
    try:
        wait_all([proc])
    finally:
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(10) == 0
    text = log.read_text()
    note = [line for line in text.splitlines() if "other procmesh components' settings" in line]
    assert len(note) == 1
    assert note[0].endswith(
        f"{', '.join(foreign)}: other procmesh components' settings (a shared ConfigMap?), "
        "not read by the go-sidecar"
    )
    assert "draining (grace 0.25s)" in text
