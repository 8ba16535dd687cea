"""`procmesh pod run`: the dev overlay's pod as local processes serves a request end to end.

The same manifests Kubernetes would run (rendered from deploy/k8s/overlays/dev) start here as
the kubelet would start them: native sidecars first, each past its startup probe, then the
orchestrator; SIGTERM stops the orchestrator first and the sidecars after it, in reverse order.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.cli.pod.manifests import render
from tests.conftest import BIN, REPO
from tests.deps import require

pytestmark = pytest.mark.e2e

DEV = REPO / "deploy" / "k8s" / "overlays" / "dev"
_PORT = re.compile(r"^pod: port (\S+)/(\S+) \d+ -> 127\.0\.0\.1:(\d+)$", re.MULTILINE)


@dataclass
class Pod:
    proc: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int]

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def start_pod(path: Path, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(BIN / "procmesh"), "pod", "run", str(path), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    require("kubectl")  # `procmesh pod run` renders the overlay with it
    log_path = tmp_path_factory.mktemp("pod") / "pod.log"
    proc = start_pod(DEV, log_path, "--free-ports")
    running = Pod(proc, log_path, {})
    deadline = time.monotonic() + 60
    while "pod: ready" not in running.log():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the pod did not get ready (exit {proc.poll()}):\n{running.log()}")
        time.sleep(0.1)
    running.ports = {f"{c}/{n}": int(p) for c, n, p in _PORT.findall(running.log())}
    yield running
    if proc.poll() is None:  # a test failed before stopping it: the pod stops its containers
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_request_through_the_pod_runs_its_processors(pod: Pod) -> None:
    secret = next(o for o in render(DEV) if o["kind"] == "Secret")
    key = secret["stringData"]["PROCMESH_API_KEYS"].rpartition("=")[0]  # KEY=@operator
    base = f"http://127.0.0.1:{pod.ports['orchestrator/http']}"
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        assert http.get("/readyz").status_code == 200  # every sidecar SERVING, seen by the orchestrator
        answer = http.post("/api/agents/assistant/generate", json={"messages": "Mail ada@example.com, darn"})
        assert answer.status_code == 200, answer.text
        result = answer.json()
        # guards/pii-redactor rewrote the input; guards/word-filter masked the output.
        assert "[email]" in result["text"]
        assert "ada@example.com" not in result["text"]
        assert "darn" not in result["text"].lower()
        blocked = http.post("/api/agents/assistant/generate", json={"messages": "a jailbreak please"}).json()
        assert blocked["tripwire"]["processorId"] == "topic-guard"
        assert http.get("/api/agents", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # Each sidecar counted its hook calls: the orchestrator reached both over their unix sockets.
    for port, processor in (
        ("guards/metric-guards", "pii-redactor"),
        ("builtins/metric-builtins", "unicode-normalizer"),
    ):
        metrics = httpx.get(f"http://127.0.0.1:{pod.ports[port]}/metrics").text
        assert re.search(rf'procmesh_sidecar_hook_calls_total\{{[^}}]*processor="{processor}"', metrics), (
            processor
        )


def test_the_pods_sidecars_reach_the_model_gateway_on_its_unix_socket(pod: Pod) -> None:
    # The orchestrator serves --grpc-socket in the sockets volume, which the builtins container's
    # PROCMESH_MODEL_GATEWAY names: any caller there is served without a key (a model the config
    # does not name is then NOT_FOUND), while the gRPC port wants a key.
    found = re.search(r"and unix:(\S+) \(procmesh\.v1\.AgentService", pod.log())
    assert found, pod.log()
    request = mpb.ModelServiceGenerateRequest(
        model="x/not-configured", messages=[mpb.ModelMessage(role="user")]
    )
    for target, code in (
        (f"unix://{found[1]}", grpc.StatusCode.NOT_FOUND),
        (f"127.0.0.1:{pod.ports['orchestrator/grpc']}", grpc.StatusCode.UNAUTHENTICATED),
    ):
        with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as refused:
            mgrpc.ModelServiceStub(channel).Generate(request, timeout=10)
        assert refused.value.code() == code, (target, refused.value)


def test_sigterm_stops_the_orchestrator_first_then_the_sidecars_in_reverse(pod: Pod) -> None:
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=60) == 0, pod.log()
    lines = [line for line in pod.log().splitlines() if line.startswith("pod: ")]
    events = [
        "pod: starting sidecar builtins",
        "pod: sidecar builtins started",
        "pod: starting sidecar guards",
        "pod: sidecar guards started",
        "pod: starting main orchestrator",
        "pod: ready",
        "pod: stopping main orchestrator",
        "pod: main orchestrator exited with 0",
        "pod: stopping sidecar guards",
        "pod: sidecar guards exited with 0",
        "pod: stopping sidecar builtins",
        "pod: sidecar builtins exited with 0",
        "pod: stopped",
    ]
    positions = [next(i for i, line in enumerate(lines) if line.startswith(e)) for e in events]
    assert positions == sorted(positions), "\n".join(lines)


BROKEN = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec:
      volumes: [{name: shared, emptyDir: {}}]
      initContainers:
        - name: prepare
          image: python
          command: [python, -c, "open('/shared/flag', 'w').write('ok')"]
          volumeMounts: [{name: shared, mountPath: /shared}]
        - name: flaky
          image: python
          restartPolicy: Always
          command: [python, -c, "import sys; sys.exit(3 if open('/shared/flag').read() == 'ok' else 4)"]
          startupProbe: {tcpSocket: {port: 1}, periodSeconds: 1, failureThreshold: 30}
          volumeMounts: [{name: shared, mountPath: /shared}]
      containers:
        - name: main
          image: python
          command: [python, -c, "pass"]
"""


def test_a_sidecar_that_exits_before_its_startup_probe_passes_fails_the_pod(tmp_path: Path) -> None:
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(BROKEN, encoding="utf-8")
    proc = start_pod(manifest, tmp_path / "pod.log")
    assert proc.wait(timeout=30) == 1
    log = (tmp_path / "pod.log").read_text(encoding="utf-8")
    # The init container wrote to the shared emptyDir, where the sidecar found it (exit 3, not 4).
    assert "pod: init container prepare completed" in log
    assert "container 'flaky' exited with 3 before its startup probe (tcp :1) passed" in log
    assert "starting main" not in log
