"""P2: a 1,000-delta streamed run through 3 pass-through speculative sidecars, against the
reference engine (@mastra/core) with 3 in-process pass-through processors, runs alternating;
beside it, the same run with no processors and with the 3 processors hosted in-process.

`python -m bench.p2_throughput` runs P2 alone as `make bench` does (its own 3 sidecars, the 3
processors in-process, the reference worker) and prints its figures as one JSON line; with
`--cpu`, the sidecars' case alone (a warm-up, then `--runs` runs): this process's CPU per run
(every thread: the event loop and gRPC's), each sidecar's (mean over the runs, `/proc`) and the
runs' wall times. Both are for comparing
commits (run it from a worktree of each, alternating)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    Reference,
    agent,
    bench_app,
    checked_run,
    deltas,
    figure,
    process_cpu,
    rounds,
    start,
    timed,
)
from bench.processors import processors
from procmesh import ProcessorServer
from procmesh_orchestrator import App, ScriptedModel


def ours(app: App, agent_id: str, n_deltas: int) -> Callable[[], Awaitable[float]]:
    return lambda: timed(lambda: checked_run(agent(app, agent_id, ScriptedModel(deltas(n_deltas))), n_deltas))


async def measure(app: App, reference: Reference | None, n_deltas: int) -> dict[str, Any]:
    """Median ms of each setup; the sidecars' ratio to the reference is the median of the rounds'."""
    systems = {
        "none": ours(app, "none", n_deltas),
        "sidecars": ours(app, "sidecars-3", n_deltas),
        "inprocess": ours(app, "inprocess-3", n_deltas),
    }
    if reference is not None:
        systems["reference"] = lambda: reference.run(run="stream", deltas=n_deltas, processors=3)
    ms = await rounds(systems)
    side = ms["sidecars"]
    results: dict[str, Any] = {
        "p2_ms_no_processors": statistics.median(ms["none"]),
        "p2_ms_sidecars": statistics.median(side),
        "p2_ms_inprocess": statistics.median(ms["inprocess"]),
        "p2_ms_reference": None,
        "p2_ratio_vs_reference": None,
        "p2_ratio_vs_reference_spread": None,
    }
    if reference is not None:
        ratio, spread = figure([s / r for s, r in zip(side, ms["reference"], strict=True)])
        results.update(
            p2_ms_reference=statistics.median(ms["reference"]),
            p2_ratio_vs_reference=ratio,
            p2_ratio_vs_reference_spread=spread,
        )
    results["p2_ratio_vs_no_processors"] = figure([s / n for s, n in zip(side, ms["none"], strict=True)])[0]
    return results


async def alone(runs: int, n_deltas: int, cpu: bool) -> dict[str, Any]:
    """P2 alone (`measure`), or with `cpu` the orchestrator's CPU and wall time per `n_deltas`-delta
    run through the 3 speculative sidecars (each its own process, as in `make bench`) over `runs`
    runs after 5 warm-up ones."""
    tmp = Path(tempfile.mkdtemp(prefix="pm-p2-"))
    names = ("s1", "s2", "s3")
    addresses = {name: f"unix://{tmp}/{name}.sock" for name in names}
    procs = [start("bench.processors", address) for address in addresses.values()]
    reference = None
    # not with `cpu`: its hook threads would count in this process's CPU
    inproc = None if cpu else ProcessorServer(processors(), [f"unix://{tmp}/inproc.sock"])
    try:
        for proc in procs:
            await proc.wait_ready()
        if inproc is not None:
            await inproc.start()
            addresses["inproc"] = inproc.addresses[0]
        agents = {
            "none": {},
            "sidecars-3": {"outputProcessors": [f"{name}/pass-{i}" for i, name in enumerate(names, start=1)]},
        }
        if inproc is not None:
            agents["inprocess-3"] = {"outputProcessors": [f"inproc/pass-{i}" for i in (1, 2, 3)]}
        async with bench_app(addresses, agents) as app:
            if not cpu:
                reference = await Reference.start()
                results = await measure(app, reference, n_deltas)
                results["loadavg"] = os.getloadavg()[0]
                return results
            run = ours(app, "sidecars-3", n_deltas)
            for _ in range(5):
                await run()
            walls, cpus = [], []
            sidecars0 = [process_cpu(proc.proc.pid) for proc in procs]
            for _ in range(runs):
                t0 = time.process_time()
                walls.append(await run())
                cpus.append((time.process_time() - t0) * 1000)
            sidecar_ms = [
                (process_cpu(p.proc.pid) - c0) * 1000 / runs for p, c0 in zip(procs, sidecars0, strict=True)
            ]
    finally:
        if reference is not None:
            await reference.close()
        if inproc is not None:
            await inproc.stop(0.5)
        for proc in procs:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "cpu_ms_per_run": statistics.median(cpus),
        "cpu_ms_min": min(cpus),
        "cpu_ms_mean": statistics.mean(cpus),
        "sidecar_cpu_ms_per_run": [round(ms, 2) for ms in sidecar_ms],
        "wall_ms": statistics.median(walls),
        "wall_ms_min": min(walls),
        "runs": runs,
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="the sidecars' case alone: CPU per run")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--deltas", type=int, default=1000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(alone(args.runs, args.deltas, args.cpu))))


if __name__ == "__main__":
    main()
