"""The rendered manifests: ``kubectl kustomize`` for a kustomization, or a YAML file of objects.

Rendering is kubectl's job, not ours: its built-in kustomize implements every kustomization field
(``configMapGenerator``, ``labels``, components, ...), so the overlays may use any of them and
what runs locally is exactly what ``kubectl apply -k`` would apply.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from procmesh_orchestrator.errors import DeployError

Obj = dict[str, Any]

KUBECTL_HINT = "install kubectl 1.27 or newer (its built-in kustomize renders deploy/k8s)"
"""The oldest kubectl we support: 1.27 embeds kustomize v5.0 (Debian's kubectl 1.20 embeds v2.0, without
`labels:`)."""
KUSTOMIZE_TIMEOUT = 60.0
"""Seconds `kubectl kustomize` may take: local files only, so only a hung kubectl gets near it."""
WORKLOADS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"})


def kustomize(directory: str | Path) -> str:
    """What ``kubectl kustomize DIRECTORY`` prints: the kustomization's objects as YAML.

    Raises:
        DeployError: kubectl is not on PATH (the message says what to install), or it failed (the
            message holds kubectl's own).
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise DeployError(f"kubectl is not installed; rendering {directory} needs it: {KUBECTL_HINT}")
    try:
        done = subprocess.run(
            [kubectl, "kustomize", str(directory)],
            capture_output=True,
            text=True,
            check=False,
            timeout=KUSTOMIZE_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"kubectl kustomize {directory} did not run: {exc}") from None
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit code {done.returncode}"
        old = _old_version(kubectl)
        hint = f" (kubectl {old} is older than procmesh supports: {KUBECTL_HINT})" if old else ""
        raise DeployError(f"kubectl kustomize {directory} failed: {why}{hint}")
    return done.stdout


def _old_version(kubectl: str) -> str | None:
    """kubectl's version if older than 1.27, whose kustomize may lack fields the overlays use; else None."""
    try:
        out = subprocess.run(
            [kubectl, "version", "--client", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        client = json.loads(out)["clientVersion"]
        major, minor = int(client["major"]), int(str(client["minor"]).rstrip("+"))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None  # cannot tell: kustomize's own message has to do
    return None if (major, minor) >= (1, 27) else str(client.get("gitVersion", f"{major}.{minor}"))


def render(path: str | Path) -> list[Obj]:
    """The objects of a kustomization directory (via `kustomize`), or of a YAML file of objects."""
    target = Path(path)
    if target.is_dir():
        where, text = f"kubectl kustomize {target}", kustomize(target)
    else:
        where = str(target)
        try:
            text = target.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeployError(f"cannot read {target}: {exc.strerror}") from None
    return _objects(_parse(text, where), where)


def name_of(obj: Obj) -> str:
    """The object's ``metadata.name`` ("" when it has none)."""
    return str(obj.get("metadata", {}).get("name", ""))


def pod_template(obj: Obj) -> Obj | None:
    """The pod spec of a workload or Pod (None for other kinds)."""
    if obj.get("kind") == "Pod":
        spec = obj.get("spec")
    else:
        spec = obj.get("spec", {}).get("template", {}).get("spec") if obj.get("kind") in WORKLOADS else None
    return spec if isinstance(spec, dict) else None


def _parse(text: str, where: str) -> list[Any]:
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise DeployError(f"{where} is not valid YAML: {exc}") from None


def _objects(docs: list[Any], where: str) -> list[Obj]:
    objects = []
    for doc in docs:
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= doc.keys():
            raise DeployError(f"{where}: every document must be an object with apiVersion, kind and metadata")
        if str(doc["kind"]).endswith("List") and "items" in doc:
            objects.extend(doc["items"])
        else:
            objects.append(doc)
    return objects
