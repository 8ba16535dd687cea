"""`make bench`: what the gRPC hop costs, measured side by side in one run (ratios, not absolute claims).

P1 one no-op unary hook vs a raw grpc.aio echo of the same bytes (unix socket and TCP).
P2 a 1,000-delta streamed run through 3 pass-through sidecars vs no processors, vs the same
   3 processors hosted in-process, vs the reference engine (@mastra/core) with 3 in-process processors.
P3 added latency per chunk at 50 chunks/s through 3 sidecars.
P4 200 concurrent streamed runs through 3 sidecars vs in-process: errors, runs/s, peak memory.
P5 a sidecar slower than a 200 ms run deadline: how far past it the run ends.

Each measure is a module (bench/p1_unary.py ... p5_deadline.py); this one starts the processes
they share, runs them in the order above (the order is part of the measure: P4's peak RSS is a
high-water mark of everything run before it), prints a table and writes bench/results.json.
``PROCMESH_BENCH_QUICK=1`` gives a shorter run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import p1_unary, p2_throughput, p3_chunk_latency, p4_concurrency, p5_deadline
from bench.harness import HERE, QUICK, free_port, handles_for, start
from bench.processors import processors as bench_processors
from bench.report import table
from procmesh import ProcessorClient, ProcessorServer
from procmesh_orchestrator import SidecarProcess


async def main() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pm-bench-"))
    procs: list[SidecarProcess] = []
    results: dict[str, Any] = {}
    try:
        uds = {name: f"unix://{tmp}/{name}.sock" for name in ("sdk", "echo", "s1", "s2", "s3")}
        tcp_sdk, tcp_echo = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        procs = [
            start("bench.processors", uds["sdk"]),
            start("bench.echo_server", uds["echo"]),
            start("bench.processors", tcp_sdk),
            start("bench.echo_server", tcp_echo),
        ]
        sidecars = [start("bench.processors", uds[f"s{i}"]) for i in (1, 2, 3)]
        procs += sidecars
        for p in procs:
            if "bench.echo_server" not in p.args:  # the echo servers have no health service
                await p.wait_ready()
        await asyncio.sleep(0.3)  # echo servers have no health service

        transports = [("uds", uds["sdk"], uds["echo"]), ("tcp", tcp_sdk, tcp_echo)]
        results.update(await p1_unary.measure(transports, 300 if QUICK else 2000))

        clients = [ProcessorClient(p.address) for p in sidecars]
        side = await handles_for(clients, ["pass-1", "pass-2", "pass-3"])
        inproc_server = ProcessorServer(bench_processors(), [f"unix://{tmp}/inproc.sock"])
        await inproc_server.start()
        inproc_client = ProcessorClient(inproc_server.addresses[0])
        inproc = await handles_for([inproc_client] * 3, ["pass-1", "pass-2", "pass-3"])

        results.update(await p2_throughput.measure(side, inproc, 1000, 3 if QUICK else 8))
        results.update(await p3_chunk_latency.measure(side, uds["echo"], 100 if QUICK else 250))
        results.update(await p4_concurrency.measure(side, inproc, sidecars, 50 if QUICK else 200))
        [slow] = await handles_for([clients[0]], ["slow"])
        results.update(await p5_deadline.measure(slow, 5 if QUICK else 20))

        for c in [*clients, inproc_client]:
            await c.close()
        await inproc_server.stop(0.5)
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    started = time.perf_counter()
    res = asyncio.run(main())
    res["bench_seconds"] = time.perf_counter() - started
    (HERE / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    print(f"\nwrote bench/results.json ({res['bench_seconds']:.0f} s)")
