"""What every measure shares: child processes, processor handles, the bench agent, percentiles."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from procmesh import ProcessorClient, convert
from procmesh_orchestrator import (
    Agent,
    AgentSpec,
    CallOptions,
    GrpcHookCaller,
    Lanes,
    OrchestratorMetrics,
    ProcessorHandle,
    SidecarProcess,
    hook_names,
)

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("PROCMESH_SHARED", HERE.parent.parent / "shared"))
ORACLE = SHARED / "conformance" / "oracle"
QUICK = os.environ.get("PROCMESH_BENCH_QUICK") == "1"


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


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- handles ---------------------------------------------------------------------------


async def handles_for(clients: list[ProcessorClient], ids: list[str]) -> list[ProcessorHandle]:
    out = []
    for client, pid in zip(clients, ids, strict=True):
        described = await client.describe(5)
        info = next(p for p in described.processors if p.id == pid)
        out.append(
            ProcessorHandle(
                key=f"bench/{pid}",
                processor_id=pid,
                client=client,
                options=convert.to_struct({}),
                hooks=hook_names(info.hooks),
                process_data_parts=False,
                timeout=30.0,
                on_failure="fail-closed",
            )
        )
    return out


# -- runs through the agent loop (P2-P5) --------------------------------------------------


def agent_with(
    model: Any, output: list[ProcessorHandle], inputs: list[ProcessorHandle] | None = None
) -> Agent:
    spec = AgentSpec(
        id="bench",
        model=model,
        hook_caller=GrpcHookCaller,
        instructions="You are helpful.",
        lanes=Lanes(input=tuple(inputs or ()), output=tuple(output)),
    )
    return Agent(spec, OrchestratorMetrics())


async def stream_run(agent: Agent) -> tuple[int, str | None]:
    stream = agent.stream("go", CallOptions())
    count = 0
    async for chunk in stream:
        if chunk["type"] == "text-delta":
            count += 1
    result = await stream.result()
    return count, result.error


def deltas(n: int) -> list[dict[str, Any]]:
    return [{"deltas": [f"w{i} " for i in range(n)]}]
