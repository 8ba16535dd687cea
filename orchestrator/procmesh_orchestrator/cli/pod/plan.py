"""A rendered Deployment as a plan of local processes: start order, argv, environment, probes, ports.

Planning starts nothing: it writes the materialised ConfigMap and Secret volumes and creates one
directory per volume, so that `runner.LocalPod` only has to start, probe and stop processes.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procmesh_orchestrator.cli.pod.manifests import Obj, name_of, pod_template
from procmesh_orchestrator.cli.pod.sources import Rewriter, Sources, expand
from procmesh_orchestrator.errors import DeployError

IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
"""The image's ENV (deploy/docker/Dockerfile) besides PATH; a test keeps the two in step."""


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
    pods = [o for o in objects if o.get("kind") in ("Deployment", "Pod") and (name in (None, name_of(o)))]
    if len(pods) != 1:
        names = sorted(name_of(o) for o in objects if o.get("kind") in ("Deployment", "Pod"))
        wanted = f" named {name!r}" if name else ""
        raise DeployError(f"expected one Deployment{wanted} in the manifests, found {names}")
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
        raise DeployError(f"{workload['kind']} {name_of(workload)!r} has no pod spec")
    meta = workload.get("metadata", {})
    template_meta = (
        meta
        if workload["kind"] == "Pod"
        else workload.get("spec", {}).get("template", {}).get("metadata", {})
    )
    namespace = str(meta.get("namespace", "default"))
    pod_name = f"{name_of(workload)}-local"
    sources = Sources(objects, namespace)
    init = list(spec.get("initContainers") or [])
    main = list(spec.get("containers") or [])
    if not main:
        raise DeployError(f"{name_of(workload)!r} has no containers")

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
            raise DeployError(
                f"volume {vname!r}: {kinds} volumes cannot run locally (emptyDir, configMap, secret)"
            )
    (directory / "tmp").mkdir(parents=True, exist_ok=True)

    containers: list[ContainerPlan] = []
    roles = [("sidecar" if c.get("restartPolicy") == "Always" else "init", c) for c in init]
    for role, container in [*roles, *(("main", c) for c in main)]:
        cname = str(container["name"])
        rewrite = Rewriter([], port_map if free_ports else {})
        private: list[tuple[Obj, Path]] = []
        for mount in container.get("volumeMounts") or []:
            vname = str(mount["name"])
            if vname not in volumes:
                raise DeployError(f"container {cname!r} mounts unknown volume {vname!r}")
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
            raise DeployError(
                f"container {cname!r} sets no command: the image's default is unknown locally; "
                "set `command:` to its console script"
            )
        argv = [rewrite(expand(a, env)) for a in command + [str(a) for a in container.get("args") or []]]
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
                pre_stop=[rewrite(expand(a, env)) for a in pre_stop] if pre_stop else None,
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


def _parse_probe(probe: Any, container: Obj, port_map: dict[int, int], rewrite: Rewriter) -> Probe | None:
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
                raise DeployError(
                    f"container {container['name']!r}: probe port {port!r} is not a declared port"
                )
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
    raise DeployError(f"container {container['name']!r}: unsupported probe {sorted(probe)}")
