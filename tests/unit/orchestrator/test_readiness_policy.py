"""Which sidecars readiness waits for: every one a run needs, never a fail-open one."""

from __future__ import annotations

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service._health import fail_open_sidecars
from tests.integration.service.support import service_config


def test_fail_open_sidecars_follow_the_policies() -> None:
    config = service_config({"guards": "unix:///g.sock", "soft": "unix:///s.sock", "held": "unix:///h.sock"})
    config["sidecars"]["soft"]["on_failure"] = "fail-open"
    config["sidecars"]["held"]["on_failure"] = "fail-open"
    # A fail-closed reference to a fail-open sidecar makes that sidecar one the runs need.
    config["agents"]["held-agent"] = {
        "model": "demo",
        "inputProcessors": [{"processor": "held/topic-guard", "on_failure": "fail-closed"}],
    }
    # A shadow reference never enforces, whatever its policy says.
    config["agents"]["soft-agent"] = {
        "model": "demo",
        "inputProcessors": [{"processor": "soft/topic-guard", "on_failure": "fail-closed", "mode": "shadow"}],
    }
    assert fail_open_sidecars(parse_config(config)) == frozenset({"soft"})
