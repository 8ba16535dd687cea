"""`plan_pod`: how a rendered Deployment becomes local processes (no process is started here)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.cli.pod.plan import find_deployment, plan_pod
from procmesh_orchestrator.config import load_config
from procmesh_orchestrator.errors import DeployError
from tests.deploy.support import flag_values, one, rendered


def test_the_dev_pod_runs_sidecars_in_order_then_the_orchestrator(tmp_path: Path) -> None:
    plan = plan_pod(rendered("dev"), tmp_path)
    assert [(c.name, c.role) for c in plan.containers] == [
        ("builtins", "sidecar"),
        ("guards", "sidecar"),
        ("orchestrator", "main"),
    ]
    builtins, guards, orchestrator = plan.containers
    sockets = tmp_path / "volumes" / "sockets"
    assert flag_values(guards.argv, "--listen") == [f"unix://{sockets}/guards.sock", "127.0.0.1:9102"]
    assert guards.argv[0] == "procmesh-sidecar"
    assert guards.startup is not None
    assert (guards.startup.action, guards.startup.port) == ("grpc", 9102)
    assert guards.startup.budget == 30
    # The ConfigMap is a file of the orchestrator's own, its socket paths rewritten like the args.
    (config_path,) = flag_values(orchestrator.argv, "--config")
    assert config_path == str(tmp_path / "containers" / "orchestrator" / "config" / "config.yaml")
    config = load_config(config_path)
    assert config.sidecars["guards"].address == f"unix://{sockets}/guards.sock"
    assert config.sidecars["builtins"].address == f"unix://{sockets}/builtins.sock"
    assert orchestrator.env["PROCMESH_API_KEYS"] == "dev-key-change-me=@operator"  # from the Secret
    assert "PROCMESH_API_KEYS" not in builtins.env
    assert flag_values(orchestrator.argv, "--http-host") == ["127.0.0.1"]
    assert orchestrator.readiness is not None
    assert (orchestrator.readiness.action, orchestrator.readiness.path) == ("httpGet", "/readyz")
    assert plan.grace == 45


def test_free_ports_are_used_alike_by_args_probes_and_the_port_list(tmp_path: Path) -> None:
    plan = plan_pod(rendered("dev"), tmp_path, free_ports=True)
    local = {(c, n): p for c, n, _, p in plan.ports}
    assert len(set(local.values())) == len(local) == 6
    guards, orchestrator = plan.containers[1], plan.containers[2]
    assert flag_values(guards.argv, "--listen")[1] == f"127.0.0.1:{local['guards', 'health-guards']}"
    assert flag_values(guards.argv, "--metrics-port") == [str(local["guards", "metric-guards"])]
    assert guards.startup is not None
    assert guards.startup.port == local["guards", "health-guards"]
    assert flag_values(orchestrator.argv, "--http-port") == [str(local["orchestrator", "http"])]
    assert orchestrator.startup is not None
    assert orchestrator.startup.port == local["orchestrator", "http"]


def test_a_secret_missing_from_the_manifests_is_named(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="Secret 'procmesh-secrets' is not in the rendered manifests"):
        plan_pod(rendered("prod"), tmp_path)


def _with_container(**changes: Any) -> list[dict[str, Any]]:
    objects = copy.deepcopy(rendered("dev"))
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    container.update(changes)
    return objects


def test_env_expansion_field_refs_and_config_map_keys(tmp_path: Path) -> None:
    config_map = one(rendered("dev"), "ConfigMap")["metadata"]["name"]  # generated: name-<hash>
    objects = _with_container(
        env=[
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ADDR", "value": "$(IP):1 $$(IP) $(UNSET)"},
            {
                "name": "CONF",
                "valueFrom": {"configMapKeyRef": {"name": config_map, "key": "config.yaml"}},
            },
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
        args=["--config", "/etc/procmesh/config.yaml", "--name", "$(POD)"],
    )
    orchestrator = plan_pod(objects, tmp_path).containers[-1]
    assert orchestrator.env["POD"] == "procmesh-local"
    assert orchestrator.env["ADDR"] == "127.0.0.1:1 $(IP) $(UNSET)"
    assert "unix://" in orchestrator.env["CONF"]
    assert "OPT" not in orchestrator.env
    assert orchestrator.argv[-1] == "procmesh-local"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"command": None}, "sets no command"),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "unknown volume"),
        (
            {
                "env": [
                    {"name": "X", "valueFrom": {"secretKeyRef": {"name": "procmesh-secrets", "key": "nope"}}}
                ]
            },
            "no key",
        ),
    ],
)
def test_what_cannot_run_locally_is_an_error(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DeployError, match=message):
        plan_pod(_with_container(**changes), tmp_path)


def test_find_deployment_wants_exactly_one() -> None:
    objects = rendered("dev")
    assert find_deployment(objects)["metadata"]["name"] == "procmesh"
    with pytest.raises(DeployError, match="named 'other'"):
        find_deployment(objects, "other")
