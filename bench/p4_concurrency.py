"""P4: concurrent streamed runs through 3 sidecars vs in-process: errors, runs/s, peak memory."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.harness import agent, deltas, peak_rss_mb, stream_run
from procmesh_orchestrator import App, ScriptedModel, SidecarProcess


async def concurrent_runs(app: App, agent_id: str, runs: int, n_deltas: int) -> tuple[int, float]:
    async def one() -> bool:
        count, error = await stream_run(agent(app, agent_id, ScriptedModel(deltas(n_deltas))))
        return error is None and count == n_deltas

    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(one() for _ in range(runs)), return_exceptions=True)
    elapsed = time.perf_counter() - t0
    errors = sum(1 for o in outcomes if o is not True)
    return errors, runs / elapsed


def rss_mb() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(app: App, sidecars: list[SidecarProcess], runs: int) -> dict[str, Any]:
    """Runs/s and errors each way; peak RSS is read right after the sidecar runs, before in-process.

    The peak is a high-water mark of everything run before P4 too, so the RSS at P4's start is kept
    beside it: the difference is what the concurrent runs added (when they set the mark).
    """
    at_start = rss_mb()
    errors, rps = await concurrent_runs(app, "sidecars-3", runs, 50)
    results: dict[str, Any] = {
        "p4_runs": runs,
        "p4_errors": errors,
        "p4_runs_per_s": rps,
        "p4_peak_rss_mb_orchestrator": peak_rss_mb(),
        "p4_rss_mb_orchestrator_at_start": round(at_start, 1),
        "p4_peak_rss_mb_sidecars": [round(peak_rss_mb(p.proc.pid), 1) for p in sidecars if p.proc],
    }
    errors_in, rps_in = await concurrent_runs(app, "inprocess-3", runs, 50)
    results.update(p4_errors_inprocess=errors_in, p4_runs_per_s_inprocess=rps_in)
    return results
