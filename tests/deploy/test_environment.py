"""Every PROCMESH_* variable the manifests give a container, by `env` or through `envFrom` (a
Secret's or ConfigMap's keys), is one that container's program reads (`procmesh.environment`): a
misspelt one would stop the container at start, so it is caught here first."""

from __future__ import annotations

import pytest

from procmesh.environment import check_environment
from tests.deploy.support import OVERLAYS, Obj, containers, rendered

COMPONENT = {"procmesh-orchestrator": "orchestrator", "procmesh-sidecar": "python-sidecar"}
"""The component of each program the pod runs."""


def _variables(container: Obj, objects: list[Obj]) -> dict[str, str]:
    """The names the container's environment gets (values elided)."""
    names = {entry["name"]: "" for entry in container.get("env", [])}
    for source in container.get("envFrom", []):
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        kind = "Secret" if "secretRef" in source else "ConfigMap"
        for obj in objects:
            if obj["kind"] == kind and obj["metadata"]["name"] == ref.get("name"):
                keys = {**obj.get("data", {}), **obj.get("stringData", {})}
                names |= {f"{source.get('prefix', '')}{key}": "" for key in keys}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_containers_procmesh_variables_are_its_programs(overlay: str) -> None:
    objects = rendered(overlay)
    problems, seen = [], 0
    for container in containers(objects):
        component = COMPONENT.get(container.get("command", [""])[0])
        if component is None:
            continue
        variables = _variables(container, objects)
        seen += sum(name.startswith("PROCMESH_") for name in variables)
        check = check_environment(component, variables)
        problems += [f"{container['name']}: {name}" for name in (*check.unknown, *check.foreign)]
    assert problems == []
    assert seen > 0  # the manifests do set some (the sidecars' PROCMESH_MODEL_GATEWAY)


def test_the_check_sees_a_misspelt_variable_in_a_container() -> None:
    objects = rendered("dev")
    sidecar = {"name": "x", "command": ["procmesh-sidecar"], "env": [{"name": "PROCMESH_MODEL_GATEWAYS"}]}
    check = check_environment("python-sidecar", _variables(sidecar, objects))
    assert check.unknown == ("PROCMESH_MODEL_GATEWAYS",)
