"""`procmesh pod`: render the Kubernetes manifests, and run their pod as local processes.

Two halves:

- **Rendering** (`render`): a pure-Python subset of ``kubectl kustomize`` for machines without
  kubectl: ``resources`` (files and directories), ``patches`` (strategic-merge patches, from a
  ``path`` or inline, optionally with a ``target``, ``$patch: delete`` included), ``images``,
  ``replicas``, ``namespace`` and ``commonLabels`` (kustomize's field specs for the kinds
  rendered here). Any other kustomization field is an error, so the manifests cannot drift
  into what this renderer would silently get wrong.
- **The local pod** (`plan_pod`, `run_pod`): the rendered Deployment's containers as local
  processes with the same command, args and environment. Secrets and ConfigMaps are
  materialised in a temporary directory, each volume becomes a directory there, and mount
  paths, ``0.0.0.0`` and (with ``free_ports``) ports are rewritten in args, environment and
  mounted files. Containers start in the kubelet's order: init containers in order, a native
  sidecar (``restartPolicy: Always``) counting as started once its startup probe passes, then
  the main containers. SIGTERM/SIGINT stops the main containers first and then the sidecars in
  reverse order, within ``terminationGracePeriodSeconds``.

Probes poll every 0.1 s instead of every ``periodSeconds`` (so a local pod starts fast) but keep
Kubernetes' budget: ``initialDelaySeconds + periodSeconds * failureThreshold``. A container that
exits stops the pod (the kubelet would restart it; locally the failure is what you want to see).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
import httpx
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh_orchestrator.errors import OrchestratorError

Obj = dict[str, Any]


class PodError(OrchestratorError):
    """A manifest this module cannot render or run, or a local pod that failed."""


# --------------------------------------------------------------------------------------------
# Rendering: a kustomize subset
# --------------------------------------------------------------------------------------------

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "patches", "images", "replicas", "namespace", "commonLabels"}
)
"""The kustomization fields `render` implements; any other one is refused."""

_CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
        "IngressClass",
    }
)
# kustomize's legacy output order (apply order): what others refer to comes first.
_KIND_ORDER = [
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
]
_WORKLOADS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"})
# Strategic-merge keys of the lists the manifests patch (from the Kubernetes API's patchMergeKey).
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ports": ("containerPort", "port"),
    "topologySpreadConstraints": ("topologyKey",),
}


def render(path: str | Path) -> list[Obj]:
    """The objects of a kustomization directory, or of a YAML file of rendered objects."""
    target = Path(path)
    if target.is_dir():
        objects = _build(target.resolve(), ())
        order = {kind: i for i, kind in enumerate(_KIND_ORDER)}
        return sorted(objects, key=lambda o: (order.get(o["kind"], len(order)), o["kind"], _name(o)))
    return _load_objects(target)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (a ConfigMap's files) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_yaml(objects: Iterable[Obj]) -> str:
    """Objects as a multi-document YAML stream (what ``kubectl kustomize`` prints)."""
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _load_yaml_docs(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PodError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise PodError(f"{path} is not valid YAML: {exc}") from None


def _load_objects(path: Path) -> list[Obj]:
    objects = []
    for doc in _load_yaml_docs(path):
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= doc.keys():
            raise PodError(f"{path}: every document must be an object with apiVersion, kind and metadata")
        if doc["kind"].endswith("List") and "items" in doc:
            objects.extend(doc["items"])
        else:
            objects.append(doc)
    return objects


def _build(directory: Path, stack: tuple[Path, ...]) -> list[Obj]:
    if directory in stack:
        raise PodError(f"kustomization cycle through {directory}")
    kfile = next((directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()), None)
    if kfile is None:
        raise PodError(f"{directory} has no kustomization.yaml")
    docs = _load_yaml_docs(kfile)
    spec = docs[0] if docs else {}
    if len(docs) != 1 or not isinstance(spec, dict):
        raise PodError(f"{kfile} must hold one mapping")
    unknown = sorted(set(spec) - SUPPORTED_FIELDS)
    if unknown:
        raise PodError(
            f"{kfile}: unsupported kustomization fields {unknown}; "
            f"this renderer implements {sorted(SUPPORTED_FIELDS)} (or use kubectl kustomize)"
        )
    objects: list[Obj] = []
    for ref in spec.get("resources") or []:
        resource = (directory / str(ref)).resolve()
        if resource.is_dir():
            objects.extend(_build(resource, (*stack, directory)))
        elif resource.is_file():
            objects.extend(_load_objects(resource))
        else:
            raise PodError(f"{kfile}: resource {ref!r} not found (remote resources are not supported)")
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), _name(obj))
        if key in seen:
            raise PodError(f"{kfile}: {key[0]} {key[2]!r} is defined twice")
        seen.add(key)
    # kustomize's transformer order: patches, namespace, labels, replicas, images.
    for i, patch in enumerate(spec.get("patches") or []):
        objects = _apply_patch(objects, patch, directory, f"{kfile}: patches[{i}]")
    if spec.get("namespace"):
        for obj in objects:
            if obj["kind"] not in _CLUSTER_SCOPED:
                meta = obj["metadata"]
                rest = {k: v for k, v in meta.items() if k not in ("name", "namespace")}
                head = {"name": meta["name"], "namespace": str(spec["namespace"])}
                meta.clear()
                meta.update({**head, **rest})
    if spec.get("commonLabels"):
        labels = {str(k): str(v) for k, v in spec["commonLabels"].items()}
        for obj in objects:
            _add_common_labels(obj, labels)
    for entry in spec.get("replicas") or []:
        _set_replicas(objects, entry, str(kfile))
    for entry in spec.get("images") or []:
        for obj in objects:
            for container in _pod_containers(obj):
                if "image" in container:
                    container["image"] = _new_image(container["image"], entry)
    return objects


def _apply_patch(objects: list[Obj], patch: Any, directory: Path, where: str) -> list[Obj]:
    if not isinstance(patch, dict) or not ({"path", "patch"} & patch.keys()):
        raise PodError(f"{where}: a patch needs `path` or `patch`")
    extra = sorted(set(patch) - {"path", "patch", "target"})
    if extra:
        raise PodError(f"{where}: unsupported patch fields {extra}")
    if "path" in patch:
        docs = _load_yaml_docs(directory / str(patch["path"]))
    else:
        docs = [d for d in yaml.safe_load_all(str(patch["patch"])) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise PodError(f"{where}: only strategic-merge patches are supported, not JSON 6902 patches")
        targets = [o for o in objects if _patch_matches(o, doc, patch.get("target"))]
        if not targets:
            raise PodError(f"{where}: no resource matches the patch for {doc.get('kind')} {_name(doc)!r}")
        if doc.get("$patch") == "delete":
            objects = [o for o in objects if not any(o is t for t in targets)]
            continue
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
        if patch.get("target"):
            body.get("metadata", {}).pop("name", None)
        for obj in targets:
            merged = strategic_merge(obj, body)
            obj.clear()
            obj.update(merged)
    return objects


def _patch_matches(obj: Obj, doc: Obj, target: Any) -> bool:
    if target:
        if not isinstance(target, dict):
            raise PodError("a patch target must be a mapping")
        if "labelSelector" in target or "annotationSelector" in target:
            raise PodError("patch targets by label or annotation selector are not supported")
        group, _, version = str(obj["apiVersion"]).rpartition("/")
        checks = {
            "kind": obj["kind"],
            "name": _name(obj),
            "namespace": obj["metadata"].get("namespace", ""),
            "group": group,
            "version": version,
        }
        for key, value in target.items():
            if key not in checks:
                raise PodError(f"unsupported patch target field {key!r}")
            if key == "name":
                if not re.fullmatch(str(value), checks["name"]):
                    return False
            elif str(value) != checks[key]:
                return False
        return True
    return bool(obj["kind"] == doc.get("kind") and _name(obj) == _name(doc))


def strategic_merge(base: Any, patch: Any, field_name: str = "") -> Any:
    """A strategic-merge patch of `base` (a new value; neither argument changes).

    Maps merge key by key (``null`` deletes a key), lists named in the Kubernetes API's merge
    keys (containers, env, volumes, ports, ...) merge item by item, ``$patch: delete`` removes
    an item, ``$patch: replace`` replaces a map; any other list is replaced.
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return _clean(patch)
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = _clean(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field_name in _MERGE_KEYS:
        key = _merge_key(field_name, base + patch)
        if key is not None:
            out_list = copy.deepcopy(base)
            for item in patch:
                index = next((i for i, b in enumerate(out_list) if b.get(key) == item.get(key)), None)
                if item.get("$patch") == "delete":
                    if index is not None:
                        del out_list[index]
                elif index is None:
                    out_list.append(_clean(item))
                else:
                    out_list[index] = strategic_merge(out_list[index], item, "")
            return out_list
    return _clean(patch)


def _merge_key(field_name: str, items: list[Any]) -> str | None:
    if not all(isinstance(i, dict) for i in items):
        return None
    for key in _MERGE_KEYS[field_name]:
        if all(key in i for i in items):
            return key
    return None


def _clean(value: Any) -> Any:
    """`value` without strategic-merge directives (``$patch``, ``$setElementOrder/...``)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return copy.deepcopy(value)


def _add_common_labels(obj: Obj, labels: dict[str, str]) -> None:
    """kustomize's commonLabels field specs, for the kinds rendered here."""

    def put(node: Any, path: list[str], create: bool) -> None:
        for key in path[:-1]:
            if not isinstance(node, dict) or (key not in node and not create):
                return
            node = node.setdefault(key, {})
        if not isinstance(node, dict):
            return
        if path[-1] in node or create:
            target = node.setdefault(path[-1], {})
            if isinstance(target, dict):
                target.update(labels)

    kind = obj["kind"]
    put(obj, ["metadata", "labels"], True)
    if kind in _WORKLOADS:
        put(obj, ["spec", "selector", "matchLabels"], True)
        put(obj, ["spec", "template", "metadata", "labels"], True)
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for constraint in spec.get("topologySpreadConstraints") or []:
            put(constraint, ["labelSelector", "matchLabels"], False)
        for affinity in ("podAffinity", "podAntiAffinity"):
            terms = spec.get("affinity", {}).get(affinity, {})
            for term in terms.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
                put(term, ["labelSelector", "matchLabels"], False)
            for term in terms.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
                put(term, ["podAffinityTerm", "labelSelector", "matchLabels"], False)
    elif kind in ("Service", "ReplicationController"):
        put(obj, ["spec", "selector"], True)
    elif kind == "PodDisruptionBudget":
        put(obj, ["spec", "selector", "matchLabels"], False)
    elif kind == "NetworkPolicy":
        put(obj, ["spec", "podSelector", "matchLabels"], False)
        for rule in obj.get("spec", {}).get("ingress") or []:
            for peer in rule.get("from") or []:
                put(peer, ["podSelector", "matchLabels"], False)
        for rule in obj.get("spec", {}).get("egress") or []:
            for peer in rule.get("to") or []:
                put(peer, ["podSelector", "matchLabels"], False)


def _set_replicas(objects: list[Obj], entry: Any, where: str) -> None:
    if not isinstance(entry, dict) or "name" not in entry or "count" not in entry:
        raise PodError(f"{where}: a replicas entry needs name and count")
    hits = [o for o in objects if o["kind"] in _WORKLOADS and _name(o) == entry["name"]]
    if not hits:
        raise PodError(f"{where}: replicas: no workload named {entry['name']!r}")
    for obj in hits:
        obj.setdefault("spec", {})["replicas"] = int(entry["count"])


def pod_template(obj: Obj) -> Obj | None:
    """The pod spec of a workload or Pod (None for other kinds)."""
    if obj.get("kind") == "Pod":
        spec = obj.get("spec")
    else:
        spec = obj.get("spec", {}).get("template", {}).get("spec") if obj.get("kind") in _WORKLOADS else None
    return spec if isinstance(spec, dict) else None


def _pod_containers(obj: Obj) -> list[Obj]:
    spec = pod_template(obj)
    if spec is None:
        return []
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def split_image(image: str) -> tuple[str, str, str]:
    """``registry/name:tag@digest`` as (name, tag, digest); tag and digest may be empty."""
    rest, _, digest = image.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        return rest[:colon], rest[colon + 1 :], digest
    return rest, "", digest


def _new_image(image: str, entry: Any) -> str:
    if not isinstance(entry, dict) or "name" not in entry:
        raise PodError(f"an images entry needs a name: {entry!r}")
    name, tag, digest = split_image(image)
    if name != entry["name"]:
        return image
    name = str(entry.get("newName", name))
    if entry.get("digest"):
        return f"{name}@{entry['digest']}"
    if entry.get("newTag") is not None:
        return f"{name}:{entry['newTag']}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


# --------------------------------------------------------------------------------------------
# The local pod: a plan built from the rendered objects
# --------------------------------------------------------------------------------------------

IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
"""The image's ENV (deploy/docker/Dockerfile) besides PATH; a test keeps the two in step."""
POLL_SECONDS = 0.1
"""How often a local probe polls (the kubelet polls every periodSeconds)."""


@dataclass(frozen=True)
class Probe:
    """One Kubernetes probe, with its ports mapped to local ones."""

    action: str
    """``grpc``, ``httpGet``, ``tcpSocket`` or ``exec``."""
    port: int = 0
    service: str = ""
    path: str = "/"
    scheme: str = "HTTP"
    host: str = "127.0.0.1"
    command: tuple[str, ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1

    @property
    def budget(self) -> float:
        """Seconds before Kubernetes gives up on the probe (a startup probe restarts the container)."""
        return self.initial_delay + self.period * self.failure_threshold

    def describe(self) -> str:
        """The probe in a word or two, for messages."""
        if self.action == "grpc":
            return f"grpc :{self.port} {self.service or '(server)'}"
        if self.action == "httpGet":
            return f"GET :{self.port}{self.path}"
        if self.action == "tcpSocket":
            return f"tcp :{self.port}"
        return "exec " + " ".join(self.command)


@dataclass
class ContainerPlan:
    """One container as a local process."""

    name: str
    role: str
    """``init`` (runs to completion), ``sidecar`` (native sidecar) or ``main``."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    startup: Probe | None = None
    readiness: Probe | None = None
    pre_stop: list[str] | None = None
    """An exec preStop hook (a sleep action is skipped locally: no endpoints to wait for)."""


@dataclass
class PodPlan:
    """A pod's containers in start order, where its files live, and its local ports."""

    name: str
    directory: Path
    containers: list[ContainerPlan]
    grace: float
    ports: list[tuple[str, str, int, int]] = field(default_factory=list)
    """(container, port name, container port, local port) for every declared port."""


def find_deployment(objects: list[Obj], name: str | None = None) -> Obj:
    """The Deployment (or Pod) called `name`, or the only one."""
    pods = [o for o in objects if o.get("kind") in ("Deployment", "Pod") and (name in (None, _name(o)))]
    if len(pods) != 1:
        names = sorted(_name(o) for o in objects if o.get("kind") in ("Deployment", "Pod"))
        wanted = f" named {name!r}" if name else ""
        raise PodError(f"expected one Deployment{wanted} in the manifests, found {names}")
    return pods[0]


def _free_port(taken: Iterable[int]) -> int:
    """A free local port not in `taken` (the kernel may hand a just-closed port out again)."""
    used = set(taken)
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in used:
            return port


def plan_pod(
    objects: list[Obj], directory: Path, *, deployment: str | None = None, free_ports: bool = False
) -> PodPlan:
    """Everything needed to run the pod of `deployment` locally, with its files under `directory`.

    Writes the materialised ConfigMap and Secret volumes and creates one directory per volume.
    """
    workload = find_deployment(objects, deployment)
    spec = pod_template(workload)
    if spec is None:
        raise PodError(f"{workload['kind']} {_name(workload)!r} has no pod spec")
    meta = workload.get("metadata", {})
    template_meta = (
        meta
        if workload["kind"] == "Pod"
        else workload.get("spec", {}).get("template", {}).get("metadata", {})
    )
    namespace = str(meta.get("namespace", "default"))
    pod_name = f"{_name(workload)}-local"
    sources = _Sources(objects, namespace)
    init = list(spec.get("initContainers") or [])
    main = list(spec.get("containers") or [])
    if not main:
        raise PodError(f"{_name(workload)!r} has no containers")

    # Ports: every declared container port (and every numeric probe port) gets a local port.
    port_map: dict[int, int] = {}
    declared: list[tuple[str, str, int]] = []
    for container in init + main:
        for port in container.get("ports") or []:
            number = int(port["containerPort"])
            declared.append((container["name"], str(port.get("name", "")), number))
            port_map.setdefault(number, _free_port(port_map.values()) if free_ports else number)
        for key in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe_port = _probe_port(container.get(key) or {})
            if isinstance(probe_port, int):
                port_map.setdefault(probe_port, _free_port(port_map.values()) if free_ports else probe_port)

    volumes = {str(v["name"]): v for v in spec.get("volumes") or []}
    volume_dirs: dict[str, Path] = {}
    for vname, volume in volumes.items():
        if "emptyDir" in volume:
            volume_dirs[vname] = directory / "volumes" / vname
            volume_dirs[vname].mkdir(parents=True, exist_ok=True)
        elif not ({"configMap", "secret"} & volume.keys()):
            kinds = sorted(set(volume) - {"name"})
            raise PodError(
                f"volume {vname!r}: {kinds} volumes cannot run locally (emptyDir, configMap, secret)"
            )
    (directory / "tmp").mkdir(parents=True, exist_ok=True)

    containers: list[ContainerPlan] = []
    roles = [("sidecar" if c.get("restartPolicy") == "Always" else "init", c) for c in init]
    for role, container in [*roles, *(("main", c) for c in main)]:
        cname = str(container["name"])
        rewrite = _Rewriter([], port_map if free_ports else {})
        private: list[tuple[Obj, Path]] = []
        for mount in container.get("volumeMounts") or []:
            vname = str(mount["name"])
            if vname not in volumes:
                raise PodError(f"container {cname!r} mounts unknown volume {vname!r}")
            if vname in volume_dirs:
                local = volume_dirs[vname]
            else:  # a ConfigMap or Secret: a private copy, rewritten for this container's mounts
                local = directory / "containers" / cname / vname
                private.append((volumes[vname], local))
            if mount.get("subPath"):
                local = local / str(mount["subPath"])
            rewrite.mounts.append((str(mount["mountPath"]), local))
        rewrite.mounts.sort(key=lambda m: -len(m[0]))
        for volume, local in private:
            sources.materialise(volume, local, rewrite)
        env = sources.environment(container, rewrite, pod_name, namespace, template_meta)
        base_env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(directory),
            "HOSTNAME": pod_name,
            "TMPDIR": str(directory / "tmp"),
            **IMAGE_ENV,
        }
        full_env = {**base_env, **env}
        command = [str(c) for c in container.get("command") or []]
        if not command:
            raise PodError(
                f"container {cname!r} sets no command: the image's default is unknown locally; "
                "set `command:` to its console script"
            )
        argv = [rewrite(_expand(a, env)) for a in command + [str(a) for a in container.get("args") or []]]
        lifecycle = container.get("lifecycle", {}).get("preStop") or {}
        pre_stop = [str(c) for c in lifecycle["exec"]["command"]] if "exec" in lifecycle else None
        containers.append(
            ContainerPlan(
                name=cname,
                role=role,
                argv=argv,
                env=full_env,
                cwd=str(directory),
                startup=_parse_probe(container.get("startupProbe"), container, port_map, rewrite),
                readiness=_parse_probe(container.get("readinessProbe"), container, port_map, rewrite),
                pre_stop=[rewrite(_expand(a, env)) for a in pre_stop] if pre_stop else None,
            )
        )
    ports = [(c, n, p, port_map[p]) for c, n, p in declared]
    grace = float(spec.get("terminationGracePeriodSeconds", 30))
    return PodPlan(name=pod_name, directory=directory, containers=containers, grace=grace, ports=ports)


def _probe_port(probe: Obj) -> int | str | None:
    for action in ("grpc", "httpGet", "tcpSocket"):
        if action in probe:
            port = probe[action].get("port")
            return port if isinstance(port, (int, str)) else None
    return None


def _parse_probe(probe: Any, container: Obj, port_map: dict[int, int], rewrite: _Rewriter) -> Probe | None:
    if not probe:
        return None
    timing: dict[str, Any] = {
        "initial_delay": float(probe.get("initialDelaySeconds", 0)),
        "period": float(probe.get("periodSeconds", 10)),
        "timeout": float(probe.get("timeoutSeconds", 1)),
        "failure_threshold": int(probe.get("failureThreshold", 3)),
        "success_threshold": int(probe.get("successThreshold", 1)),
    }
    if "exec" in probe:
        return Probe("exec", command=tuple(rewrite(str(c)) for c in probe["exec"]["command"]), **timing)
    for action in ("grpc", "httpGet", "tcpSocket"):
        if action not in probe:
            continue
        body = probe[action]
        port = body.get("port")
        if isinstance(port, str) and not port.isdigit():
            named = [p for p in container.get("ports") or [] if p.get("name") == port]
            if not named:
                raise PodError(f"container {container['name']!r}: probe port {port!r} is not a declared port")
            port = named[0]["containerPort"]
        number = port_map.get(int(port), int(port))
        host = str(body.get("host") or "127.0.0.1")
        return Probe(
            action,
            port=number,
            service=str(body.get("service", "")),
            path=str(body.get("path", "/")),
            scheme=str(body.get("scheme", "HTTP")),
            host=rewrite(host),
            **timing,
        )
    raise PodError(f"container {container['name']!r}: unsupported probe {sorted(probe)}")


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` escapes."""

    def sub(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VAR.sub(sub, text)


class _Rewriter:
    """Rewrites container paths to local ones, the pod IP to loopback, and remapped ports."""

    def __init__(self, mounts: list[tuple[str, Path]], ports: dict[int, int]) -> None:
        self.mounts = mounts
        self.ports = {k: v for k, v in ports.items() if k != v}

    def __call__(self, text: str) -> str:
        for mount_path, local in self.mounts:
            # A whole path component: `unix:///run/procmesh/x.sock`, `--config=/etc/procmesh/a`.
            pattern = r"(?:(?<=://)|(?<![\w./-]))" + re.escape(mount_path.rstrip("/")) + r"(?=/|$|[^\w.-])"
            text = re.sub(pattern, str(local).replace("\\", "\\\\"), text)
        text = re.sub(r"(?<![\w.])0\.0\.0\.0(?![\w.])", "127.0.0.1", text)
        text = text.replace("[::]:", "127.0.0.1:")
        if self.ports:
            if text.isdigit() and int(text) in self.ports:
                return str(self.ports[int(text)])
            text = re.sub(r"(?<=:)(\d{1,5})(?!\d)", lambda m: str(self.ports.get(int(m[1]), m[1])), text)
        return text


class _Sources:
    """The ConfigMaps and Secrets of the rendered manifests, for env and volumes."""

    def __init__(self, objects: list[Obj], namespace: str) -> None:
        self.config_maps: dict[str, dict[str, str]] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        for obj in objects:
            if obj.get("metadata", {}).get("namespace", namespace) != namespace:
                continue
            if obj["kind"] == "ConfigMap":
                data = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
                for k, v in (obj.get("binaryData") or {}).items():
                    data[str(k)] = base64.b64decode(v).decode("utf-8", errors="replace")
                self.config_maps[_name(obj)] = data
            elif obj["kind"] == "Secret":
                data = {
                    str(k): base64.b64decode(v).decode("utf-8", errors="replace")
                    for k, v in (obj.get("data") or {}).items()
                }
                data.update({str(k): str(v) for k, v in (obj.get("stringData") or {}).items()})
                self.secrets[_name(obj)] = data

    def _source(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        store = self.config_maps if kind == "ConfigMap" else self.secrets
        if name in store:
            return store[name]
        if optional:
            return None
        raise PodError(
            f"{kind} {name!r} is not in the rendered manifests; a local pod reads it from them "
            f"(add it to the overlay, or render one that has it)"
        )

    def materialise(self, volume: Obj, target: Path, rewrite: _Rewriter) -> None:
        kind, body = (
            ("ConfigMap", volume["configMap"]) if "configMap" in volume else ("Secret", volume["secret"])
        )
        name = str(body.get("name") or body.get("secretName"))
        data = self._source(kind, name, bool(body.get("optional"))) or {}
        items = body.get("items") or [{"key": k, "path": k} for k in data]
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            if item["key"] not in data:
                raise PodError(f"{kind} {name!r} has no key {item['key']!r}")
            path = target / str(item["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rewrite(data[item["key"]]), encoding="utf-8")

    def environment(
        self, container: Obj, rewrite: _Rewriter, pod_name: str, namespace: str, template_meta: Obj
    ) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = str(source.get("prefix", ""))
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in source:
                    ref = source[key]
                    data = self._source(kind, str(ref["name"]), bool(ref.get("optional"))) or {}
                    env.update({prefix + k: v for k, v in data.items()})
        for var in container.get("env") or []:
            name = str(var["name"])
            if "value" in var:
                env[name] = _expand(str(var["value"]), env)
                continue
            ref = var.get("valueFrom") or {}
            if "configMapKeyRef" in ref or "secretKeyRef" in ref:
                kind, key = (
                    ("ConfigMap", "configMapKeyRef")
                    if "configMapKeyRef" in ref
                    else ("Secret", "secretKeyRef")
                )
                body = ref[key]
                values = self._source(kind, str(body["name"]), bool(body.get("optional")))
                if values is None:
                    continue
                if body["key"] not in values:
                    if body.get("optional"):
                        continue
                    raise PodError(f"{kind} {body['name']!r} has no key {body['key']!r}")
                env[name] = values[body["key"]]
            elif "fieldRef" in ref:
                env[name] = self._field(str(ref["fieldRef"]["fieldPath"]), pod_name, namespace, template_meta)
            elif "value" not in var:
                raise PodError(f"env {name!r}: {sorted(ref)} cannot be resolved locally")
        return {k: rewrite(v) for k, v in env.items()}

    @staticmethod
    def _field(path: str, pod_name: str, namespace: str, meta: Obj) -> str:
        simple = {
            "metadata.name": pod_name,
            "metadata.namespace": namespace,
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "spec.nodeName": socket.gethostname(),
            "spec.serviceAccountName": "default",
        }
        if path in simple:
            return simple[path]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if match:
            return str((meta.get(match[1]) or {}).get(match[2], ""))
        raise PodError(f"fieldRef {path!r} cannot be resolved locally")


# --------------------------------------------------------------------------------------------
# The local pod: running it
# --------------------------------------------------------------------------------------------


class _Stopped(Exception):
    """SIGTERM/SIGINT arrived while the pod was starting."""


@dataclass
class _Running:
    plan: ContainerPlan
    proc: asyncio.subprocess.Process
    pump: asyncio.Task[None]


async def probe_once(probe: Probe, env: dict[str, str] | None = None) -> str | None:
    """Run `probe` once: None when it passes, else why it failed."""
    try:
        if probe.action == "grpc":
            async with grpc.aio.insecure_channel(f"{probe.host}:{probe.port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                response = await stub.Check(
                    health_pb2.HealthCheckRequest(service=probe.service), timeout=probe.timeout
                )
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            return None if status == "SERVING" else str(status)
        if probe.action == "httpGet":
            url = f"{probe.scheme.lower()}://{probe.host}:{probe.port}{probe.path}"
            async with httpx.AsyncClient(timeout=probe.timeout, verify=False) as client:
                code = (await client.get(url)).status_code
            return None if 200 <= code < 400 else f"HTTP {code}"
        if probe.action == "tcpSocket":
            _, writer = await asyncio.wait_for(asyncio.open_connection(probe.host, probe.port), probe.timeout)
            writer.close()
            return None
        proc = await asyncio.create_subprocess_exec(
            *probe.command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            code = await asyncio.wait_for(proc.wait(), probe.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return "timed out"
        return None if code == 0 else f"exit code {code}"
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    except (OSError, TimeoutError, httpx.HTTPError) as exc:
        return f"{type(exc).__name__}: {exc}"


class LocalPod:
    """Runs a `PodPlan`: start in the kubelet's order, wait for probes, stop in reverse."""

    def __init__(self, plan: PodPlan, out: TextIO | None = None) -> None:
        self.plan = plan
        self.out = out or sys.stdout
        self.stop_requested = asyncio.Event()
        self.ready = asyncio.Event()
        self._running: list[_Running] = []

    def log(self, message: str) -> None:
        """A line of the pod's own output (container output is prefixed with its name)."""
        self.out.write(f"pod: {message}\n")
        self.out.flush()

    async def run(self) -> int:
        """Start the pod, wait for a stop signal or a failure, stop it; the exit code (0: clean)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        failure: str | None = None
        try:
            await self._start()
            self.log(f"ready: {self.plan.name} (Ctrl-C or SIGTERM stops it)")
            self.ready.set()
            failure = await self._watch()
        except _Stopped:
            self.log("stop requested during start-up")
        except PodError as exc:
            failure = str(exc)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            codes = await self._stop()
        if failure:
            self.log(f"failed: {failure}")
            return 1
        unclean = {name: code for name, code in codes.items() if code != 0}
        if unclean:
            self.log(f"containers that did not exit cleanly: {unclean}")
            return 1
        self.log("stopped")
        return 0

    async def _start(self) -> None:
        for container in self.plan.containers:
            if container.role == "main":
                continue
            running = await self._spawn(container)
            if container.role == "init":
                code = await self._until(running.proc.wait(), running)
                await running.pump
                self._running.remove(running)
                if code != 0:
                    raise PodError(f"init container {container.name!r} exited with {code}")
                self.log(f"init container {container.name} completed")
            elif container.startup is not None:
                await self._await_probe(running, container.startup, "startup", deadline=True)
                self.log(f"sidecar {container.name} started ({container.startup.describe()} passed)")
            else:
                self.log(f"sidecar {container.name} started (no startup probe)")
        mains = [await self._spawn(c) for c in self.plan.containers if c.role == "main"]
        for running in mains:
            if running.plan.startup is not None:
                await self._await_probe(running, running.plan.startup, "startup", deadline=True)
        for running in list(self._running):
            if running.plan.readiness is not None:
                await self._await_probe(running, running.plan.readiness, "readiness", deadline=False)

    async def _spawn(self, container: ContainerPlan) -> _Running:
        self.log(f"starting {container.role} {container.name}: {' '.join(container.argv)}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *container.argv,
                env=container.env,
                cwd=container.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the pod, which stops containers in order
            )
        except OSError as exc:
            raise PodError(
                f"container {container.name!r} cannot start {container.argv[0]!r}: {exc}"
            ) from None
        assert proc.stdout is not None
        running = _Running(container, proc, asyncio.create_task(self._pump(container.name, proc.stdout)))
        self._running.append(running)
        return running

    async def _pump(self, name: str, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.out.write(f"[{name}] {line.decode('utf-8', errors='replace').rstrip()}\n")
            self.out.flush()

    async def _until(self, awaitable: Any, running: _Running | None = None) -> Any:
        """Await `awaitable` unless a stop is requested first (then raise `_Stopped`)."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.create_task(self.stop_requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise _Stopped
        return task.result()

    async def _await_probe(self, running: _Running, probe: Probe, kind: str, *, deadline: bool) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if probe.initial_delay:
            await self._until(asyncio.sleep(probe.initial_delay))
        successes = 0
        last = "not probed yet"
        next_report = start + 10
        while True:
            if running.proc.returncode is not None:
                raise PodError(
                    f"container {running.plan.name!r} exited with {running.proc.returncode} "
                    f"before its {kind} probe ({probe.describe()}) passed"
                )
            reason = await self._until(probe_once(probe, running.plan.env))
            if reason is None:
                successes += 1
                if successes >= probe.success_threshold:
                    return
            else:
                successes, last = 0, reason
            now = loop.time()
            if deadline and now - start > probe.budget:
                raise PodError(
                    f"container {running.plan.name!r}: {kind} probe ({probe.describe()}) still failing "
                    f"after {probe.budget:g}s: {last}"
                )
            if now > next_report:
                self.log(f"waiting for {running.plan.name} {kind} ({probe.describe()}): {last}")
                next_report = now + 10
            await self._until(asyncio.sleep(min(probe.period, POLL_SECONDS)))

    async def _watch(self) -> str | None:
        """Wait for a stop request (None) or for a container to exit (why the pod failed)."""
        exits = {asyncio.ensure_future(r.proc.wait()): r for r in self._running}
        stop = asyncio.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait({stop, *exits}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, *exits):
            if task not in done:
                task.cancel()
        for task in done:
            if task in exits:
                running = exits[task]
                return f"container {running.plan.name!r} exited with {running.proc.returncode}"
        return None

    async def _stop(self) -> dict[str, int]:
        """Main containers first (preStop, SIGTERM), then sidecars in reverse start order."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.plan.grace
        codes: dict[str, int] = {}
        mains = [r for r in self._running if r.plan.role == "main"]
        sidecars = [r for r in self._running if r.plan.role != "main"]
        await asyncio.gather(*(self._pre_stop(r, deadline) for r in mains))
        results = await asyncio.gather(*(self._terminate(r, deadline) for r in mains))
        codes.update(zip((r.plan.name for r in mains), results, strict=True))
        for running in reversed(sidecars):
            codes[running.plan.name] = await self._terminate(running, deadline)
        self._running.clear()
        return codes

    async def _pre_stop(self, running: _Running, deadline: float) -> None:
        if not running.plan.pre_stop or running.proc.returncode is not None:
            return
        loop = asyncio.get_running_loop()
        hook = await asyncio.create_subprocess_exec(
            *running.plan.pre_stop, env=running.plan.env, stdin=asyncio.subprocess.DEVNULL
        )
        try:
            await asyncio.wait_for(hook.wait(), max(deadline - loop.time(), 0.1))
        except TimeoutError:
            hook.kill()
            await hook.wait()

    async def _terminate(self, running: _Running, deadline: float) -> int:
        loop = asyncio.get_running_loop()
        proc = running.proc
        if proc.returncode is None:
            self.log(f"stopping {running.plan.role} {running.plan.name}")
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), max(deadline - loop.time(), 0.1))
            except TimeoutError:
                self.log(f"{running.plan.name} did not stop within the grace period: killed")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        await running.pump
        code = proc.returncode
        assert code is not None
        self.log(f"{running.plan.role} {running.plan.name} exited with {code}")
        return code


# --------------------------------------------------------------------------------------------
# The `procmesh pod` command
# --------------------------------------------------------------------------------------------


def render_command(path: str, out: TextIO | None = None) -> int:
    """``procmesh pod render PATH``: print the rendered manifests."""
    (out or sys.stdout).write(render_yaml(render(path)))
    return 0


def run_command(
    path: str,
    *,
    deployment: str | None = None,
    free_ports: bool = False,
    keep: bool = False,
    out: TextIO | None = None,
) -> int:
    """``procmesh pod run PATH``: run the rendered pod locally until SIGTERM/SIGINT."""
    objects = render(path)
    directory = Path(tempfile.mkdtemp(prefix="pm-pod-"))  # short: unix socket paths are limited
    stream = out or sys.stdout
    try:
        plan = plan_pod(objects, directory, deployment=deployment, free_ports=free_ports)
        pod = LocalPod(plan, stream)
        pod.log(f"{plan.name}: {len(plan.containers)} containers, files in {directory}")
        for container, name, port, local in plan.ports:
            pod.log(f"port {container}/{name or port} {port} -> 127.0.0.1:{local}")
        return asyncio.run(pod.run())
    finally:
        if keep:
            stream.write(f"pod: kept {directory}\n")
        else:
            shutil.rmtree(directory, ignore_errors=True)
