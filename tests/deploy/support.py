"""Helpers for the deploy tests: the overlays as `kubectl kustomize` renders them, and the pod's parts."""

from __future__ import annotations

import functools
import tomllib
from typing import Any

from procmesh_orchestrator.cli.pod.manifests import render
from tests.conftest import REPO
from tests.deps import require

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
IMAGE = "procmesh"
"""The image name in the base manifests, which the overlays' `images:` rewrite."""

Obj = dict[str, Any]


@functools.cache
def _rendered(overlay: str) -> tuple[Obj, ...]:
    require("kubectl")  # without it, fail with the install hint rather than render's DeployError
    return tuple(render(K8S / "overlays" / overlay))


def rendered(overlay: str) -> list[Obj]:
    """The overlay's objects (rendered once per test session; callers must not mutate them)."""
    return list(_rendered(overlay))


def one(objects: list[Obj], kind: str) -> Obj:
    """The only object of `kind`."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(objects: list[Obj]) -> Obj:
    """The Deployment's pod spec."""
    spec: Obj = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def containers(objects: list[Obj]) -> list[Obj]:
    """Every container of the pod: init containers (sidecars) first, in order."""
    spec = pod_spec(objects)
    return [*spec.get("initContainers", []), *spec["containers"]]


def sidecars(objects: list[Obj]) -> list[Obj]:
    """The native sidecars (init containers with restartPolicy Always)."""
    return [c for c in pod_spec(objects).get("initContainers", []) if c.get("restartPolicy") == "Always"]


def flag_values(args: list[str], flag: str) -> list[str]:
    """Every value of a repeatable ``--flag VALUE`` / ``--flag=VALUE`` in `args`."""
    values = []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


DISTRIBUTIONS = ("sdk", "sidecars", "orchestrator")
"""The repository's folders that are each one Python distribution."""


def console_scripts() -> set[str]:
    """The console scripts the three distributions install."""
    scripts: set[str] = set()
    for folder in DISTRIBUTIONS:
        with open(REPO / folder / "pyproject.toml", "rb") as f:
            scripts |= set(tomllib.load(f)["project"].get("scripts", {}))
    return scripts


def volume_path(container: Obj, path: str) -> tuple[str, str] | None:
    """(volume, path inside it) of a file path as `container` sees it (None: not on a volume)."""
    best: tuple[str, str] | None = None
    best_len = -1
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if (path == root or path.startswith(root + "/")) and len(root) > best_len:
            inner = path[len(root) :].lstrip("/")
            if mount.get("subPath"):
                inner = f"{mount['subPath']}/{inner}".rstrip("/")
            best, best_len = (mount["name"], inner), len(root)
    return best


def unix_path(address: str) -> str | None:
    """The file path of a ``unix:`` gRPC address (None for host:port)."""
    if address.startswith("unix://"):
        return address[len("unix://") :]
    if address.startswith("unix:"):
        return address[len("unix:") :]
    return None


def split_image(image: str) -> tuple[str, str, str]:
    """``registry/name:tag@digest`` as (name, tag, digest); tag and digest may be empty."""
    rest, _, digest = image.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:  # a colon before the last slash is a registry's port, not a tag
        return rest[:colon], rest[colon + 1 :], digest
    return rest, "", digest
