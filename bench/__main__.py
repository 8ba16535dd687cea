"""`make bench`: what moving processors out of process costs, or saves, measured in one run.

P1 one no-op unary hook vs a raw grpc.aio echo of the same bytes (unix socket and TCP).
P2 a 1,000-delta streamed run through 3 speculative pass-through sidecars vs the reference engine
   (@mastra/core) with 3 in-process processors; beside it no processors, and the 3 in-process.
P3 added p99 latency per chunk at 50 chunks/s through 3 speculative sidecars (vs the p99 of 3
   parallel raw grpc.aio bidi echo hops, and of one), and the 3 fused in one sidecar (vs one hop).
P4 200 concurrent streamed runs through 3 sidecars vs in-process: errors, runs/s, peak memory.
P5 a sidecar slower than a 200 ms run deadline: how far past it the run ends.
P6 three 50 ms speculative input guards: what they add vs the reference (sequential there), and
   the time to the first chunk with the optimistic first step vs the sequential engine.
P7 the per-chunk cost of each pass-through processor in lanes of 1, 3, 6 and 10.
P8 an HTTP request on a kept-alive connection vs on a fresh one (a real orchestrator process).
P8 (issue 33, p10_guards_planner) five LLM-judged guards on a 200 ms scripted judge: judge calls vs
   the reference's own guards, added time to the first chunk, equal verdicts on the golden set;
   the judge is a process of its own (p8_judge), which both engines ask, as a remote judge is.
P9 semantic recall at 10k and 100k stored messages, SQLite (exact) and PostgreSQL (pgvector HNSW).

Compared systems run in alternating rounds (harness.rounds: A, B, A, B, ...), each figure is the
median of the rounds' ratios and its spread is kept beside it (``*_spread``). The reference
engine is one long-lived Node worker (bench/reference.mjs), so its runs alternate with ours. Each
measure is a module; this one starts the processes they share, runs them in the order above (P4's
peak RSS is a high-water mark of everything run or imported before it, so P9's module is imported
after it), prints a table and writes bench/results.json. ``PROCMESH_BENCH_QUICK=1`` gives a shorter run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import (
    p1_unary,
    p2_throughput,
    p3_chunk_latency,
    p4_concurrency,
    p5_deadline,
    p6_guards,
    p7_per_processor,
    p8_keepalive,
    p10_guards_planner,
)
from bench.harness import HERE, QUICK, Reference, bench_app, free_port, start
from bench.processors import GUARDS
from bench.processors import processors as bench_processors
from bench.report import table
from procmesh import ProcessorServer
from procmesh_orchestrator import SidecarProcess

SIDECARS = ["s1", "s2", "s3"]


def agents() -> dict[str, dict[str, Any]]:
    """Every agent a measure runs, by lane."""
    guards = [f"{s}/guard-{i}" for i, s in enumerate(SIDECARS[:GUARDS], start=1)]
    out: dict[str, dict[str, Any]] = {
        "none": {},
        "sidecars-3": {"outputProcessors": [f"{s}/pass-{i}" for i, s in enumerate(SIDECARS, start=1)]},
        "fused-3": {"outputProcessors": [f"s1/pass-{i}" for i in (1, 2, 3)]},
        "inprocess-3": {"outputProcessors": [f"inproc/pass-{i}" for i in (1, 2, 3)]},
        "slow-input": {"inputProcessors": ["s1/slow"]},
        "guards": {"inputProcessors": guards},
        "guards-sequential": {"inputProcessors": [{"processor": g, "speculative": False} for g in guards]},
        "guards-optimistic": {"inputProcessors": guards, "optimisticFirstStep": True},
    }
    for k in p7_per_processor.LANES:
        out[f"pass-{k}"] = {"outputProcessors": p7_per_processor.lane(k, SIDECARS)}
    return out


async def main() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pm-bench-"))
    procs: list[SidecarProcess] = []
    results: dict[str, Any] = {}
    reference = None
    try:
        uds = {name: f"unix://{tmp}/{name}.sock" for name in ("sdk", "echo", *SIDECARS)}
        tcp_sdk, tcp_echo = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        echoes = [start("bench.echo_server", uds["echo"]), start("bench.echo_server", tcp_echo)]
        sidecars = [start("bench.processors", uds[s]) for s in SIDECARS]
        hosts = [start("bench.processors", uds["sdk"]), start("bench.processors", tcp_sdk), *sidecars]
        procs = [*echoes, *hosts]
        for p in hosts:  # the echo servers have no health service
            await p.wait_ready()
        await asyncio.sleep(0.3)  # the echo servers' start
        inproc_server = ProcessorServer(bench_processors(), [f"unix://{tmp}/inproc.sock"])
        await inproc_server.start()
        addresses = {"sdk": uds["sdk"], "tcp": tcp_sdk, **{s: uds[s] for s in SIDECARS}}
        addresses["inproc"] = inproc_server.addresses[0]
        reference = await Reference.start()
        async with bench_app(addresses, agents()) as app:
            transports = [("uds", "sdk", uds["echo"]), ("tcp", "tcp", tcp_echo)]
            results.update(await p1_unary.measure(app, transports, 300 if QUICK else 2000))
            results.update(await p2_throughput.measure(app, reference, 1000))
            results.update(await p3_chunk_latency.measure(app, uds["echo"], 30 if QUICK else 300))
            results.update(await p4_concurrency.measure(app, sidecars, 50 if QUICK else 200))
            results.update(await p5_deadline.measure(app, 5 if QUICK else 20))
            results.update(await p6_guards.measure(app, reference))
            results.update(await p7_per_processor.measure(app, 1000))
        results.update(await p8_keepalive.measure(50 if QUICK else 200))
        results.update(await p10_guards_planner.measure(reference))
        # Imported only now: numpy, psycopg and the test helpers P9 needs add about 26 MiB that
        # the orchestrator never loads, and P4's peak RSS (a high-water mark) would count them.
        from bench import p9_recall

        results.update(await p9_recall.measure())
        await inproc_server.stop(0.5)
    finally:
        if reference is not None:
            await reference.close()
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
