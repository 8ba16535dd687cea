"""The `procmesh pod render` and `procmesh pod run` commands."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TextIO

import yaml

from procmesh_orchestrator.cli.pod.manifests import kustomize, render
from procmesh_orchestrator.cli.pod.plan import plan_pod
from procmesh_orchestrator.cli.pod.runner import LocalPod


def render_command(path: str, out: TextIO | None = None) -> int:
    """``procmesh pod render PATH``: print what ``kubectl kustomize PATH`` prints.

    A YAML file of rendered objects prints as its objects (a ``List``'s items one by one), the
    same objects `run_command` would run.
    """
    text = kustomize(path) if Path(path).is_dir() else yaml.safe_dump_all(render(path), sort_keys=False)
    (out or sys.stdout).write(text)
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
