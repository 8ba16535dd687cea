"""What a container sees: ConfigMaps and Secrets as environment and files, with local paths.

Kubernetes gives each container its own filesystem; locally every container shares the machine's,
so `Rewriter` maps each mount path, the pod IP (``0.0.0.0``) and remapped ports to their local
counterparts in args, environment and mounted files alike.
"""

from __future__ import annotations

import base64
import re
import socket
from pathlib import Path

from procmesh_orchestrator.cli.pod.manifests import Obj, name_of
from procmesh_orchestrator.errors import DeployError

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` escapes."""

    def sub(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VAR.sub(sub, text)


class Rewriter:
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


class Sources:
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
                self.config_maps[name_of(obj)] = data
            elif obj["kind"] == "Secret":
                data = {
                    str(k): base64.b64decode(v).decode("utf-8", errors="replace")
                    for k, v in (obj.get("data") or {}).items()
                }
                data.update({str(k): str(v) for k, v in (obj.get("stringData") or {}).items()})
                self.secrets[name_of(obj)] = data

    def _source(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        store = self.config_maps if kind == "ConfigMap" else self.secrets
        if name in store:
            return store[name]
        if optional:
            return None
        raise DeployError(
            f"{kind} {name!r} is not in the rendered manifests; a local pod reads it from them "
            f"(add it to the overlay, or render one that has it)"
        )

    def materialise(self, volume: Obj, target: Path, rewrite: Rewriter) -> None:
        """Write a ConfigMap or Secret `volume`'s files under `target`, their paths rewritten."""
        kind, body = (
            ("ConfigMap", volume["configMap"]) if "configMap" in volume else ("Secret", volume["secret"])
        )
        name = str(body.get("name") or body.get("secretName"))
        data = self._source(kind, name, bool(body.get("optional"))) or {}
        items = body.get("items") or [{"key": k, "path": k} for k in data]
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            if item["key"] not in data:
                raise DeployError(f"{kind} {name!r} has no key {item['key']!r}")
            path = target / str(item["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rewrite(data[item["key"]]), encoding="utf-8")

    def environment(
        self, container: Obj, rewrite: Rewriter, pod_name: str, namespace: str, template_meta: Obj
    ) -> dict[str, str]:
        """The container's ``envFrom`` and ``env``, resolved as the kubelet would, then rewritten."""
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
                env[name] = expand(str(var["value"]), env)
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
                    raise DeployError(f"{kind} {body['name']!r} has no key {body['key']!r}")
                env[name] = values[body["key"]]
            elif "fieldRef" in ref:
                env[name] = self._field(str(ref["fieldRef"]["fieldPath"]), pod_name, namespace, template_meta)
            elif "value" not in var:
                raise DeployError(f"env {name!r}: {sorted(ref)} cannot be resolved locally")
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
        raise DeployError(f"fieldRef {path!r} cannot be resolved locally")
