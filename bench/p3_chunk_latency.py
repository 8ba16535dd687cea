"""P3: added latency per chunk at 50 chunks/s through 3 speculative sidecars, and through the same
3 processors fused in one sidecar, against ONE raw grpc.aio bidi echo hop measured in the same
rounds; the 3 sidecars also against 3 PARALLEL raw hops to 3 echo processes (the topology's own
limit: a chunk waits for the slowest of three), and for the record 3 raw hops in a row.

`python -m bench.p3_chunk_latency --fused-only` runs P3 fused alone (its own sidecar and echo
server, no processors / fused / one raw hop alternating) and prints one JSON line: the figure,
each round's ratio and the CPU per fused chunk; without `--fused-only`, all of P3 as `make bench`
runs it. Both are for comparing commits (run it from a worktree of each, alternating)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.echo_server import STREAM_METHOD
from bench.harness import agent, bench_app, figure, free_port, pct, process_cpu, rounds, start
from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import App, ModelRequest, ScriptedModel

INTERVAL = 0.02
"""50 chunks/s."""
P3_ROUNDS = 7
"""Rounds of P3 (the issue's floor): a round of 300 chunks takes 6 s per system, so the bench's 9
rounds of them would add more than a minute for little (the p99 of 300 chunks is what steadies
the figure: with 100 it was the second largest, one scheduling delay)."""
WARMUP_CHUNKS = 30
"""The warm-up round's chunks per system (not counted: connections, caches)."""
_CHUNK = convert.chunk_to_proto({"type": "text-delta", "payload": {"text": "7 "}})
PAYLOAD = ppb.ProcessOutputStreamRequest(parts=[ppb.StreamPart(seq=1, part=_CHUNK)]).SerializeToString()
"""A raw hop's message: one chunk-sized part."""


class TimedModel(ScriptedModel):
    """Streams numbered deltas at a fixed rate, recording when each left the model."""

    def __init__(self, n: int, interval_s: float) -> None:
        super().__init__([])
        self.n = n
        self.interval = interval_s
        self.sent: dict[int, float] = {}

    async def stream(self, request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        for i in range(self.n):
            if i:
                await asyncio.sleep(self.interval)
            self.sent[i] = time.perf_counter()
            yield {"type": "text-delta", "payload": {"id": "t", "text": f"{i} "}}
        yield {"type": "finish", "payload": {"finishReason": "stop", "usage": {}}}


async def chunk_latencies(app: App, agent_id: str, n: int) -> list[float]:
    """Milliseconds from the model's yield to the caller's read, per text delta."""
    model = TimedModel(n, INTERVAL)
    stream = agent(app, agent_id, model).stream("go")
    lat = []
    async for chunk in stream:
        if chunk["type"] == "text-delta":
            i = int(chunk["payload"]["text"])
            lat.append((time.perf_counter() - model.sent[i]) * 1000)
    result = await stream.result()
    if result.error or len(lat) != n:
        raise RuntimeError(f"bench run failed: {result.error} ({len(lat)}/{n} deltas)")
    return lat


async def raw_hops(channel: grpc.aio.Channel, hops: int, n: int) -> list[float]:
    """One chunk-sized message through `hops` raw bidi echo streams in a row, at the same rate."""
    calls = [channel.stream_stream(STREAM_METHOD)() for _ in range(hops)]
    lat = []
    for i in range(n):
        if i:
            await asyncio.sleep(INTERVAL)
        t0 = time.perf_counter()
        for call in calls:
            await call.write(PAYLOAD)
            await call.read()
        lat.append((time.perf_counter() - t0) * 1000)
    for call in calls:
        call.cancel()
    return lat


async def parallel_hops(channels: list[grpc.aio.Channel], n: int) -> list[float]:
    """One chunk-sized message through one raw bidi echo stream per channel at once (each to its own
    echo process), at the same rate: the time until the last answer."""
    calls = [channel.stream_stream(STREAM_METHOD)() for channel in channels]

    async def hop(call: Any) -> None:
        await call.write(PAYLOAD)
        await call.read()

    lat = []
    for i in range(n):
        if i:
            await asyncio.sleep(INTERVAL)
        t0 = time.perf_counter()
        await asyncio.gather(*(hop(call) for call in calls))
        lat.append((time.perf_counter() - t0) * 1000)
    for call in calls:
        call.cancel()
    return lat


def beside(address: str, i: int) -> str:
    """Another echo server's address next to `address` (a socket in its folder, or a free port)."""
    if address.startswith("unix://"):
        path = Path(address.removeprefix("unix://"))
        return f"unix://{path.with_name(f'{path.stem}-{i}{path.suffix}')}"
    return f"127.0.0.1:{free_port()}"


async def measure(app: App, echo_address: str, n: int) -> dict[str, Any]:
    """After a short warm-up round, per round (`P3_ROUNDS`, `n` chunks each): no processors, 3
    sidecars, 3 fused, one raw hop, 3 raw hops, 3 parallel raw hops; the figures are the
    median over rounds of (that round's p99 through the processors - its no-processor p50) / that
    round's one-hop p99; and the 3 sidecars' added p99 / that round's p99 of 3 parallel hops."""
    others = [beside(echo_address, i) for i in (2, 3)]
    echoes = [start("bench.echo_server", address) for address in others]
    await asyncio.sleep(0.3)  # their start (an echo server has no health service)
    channel = grpc.aio.insecure_channel(echo_address)
    channels = [channel, *(grpc.aio.insecure_channel(address) for address in others)]

    def systems(chunks: int) -> dict[str, Callable[[], Awaitable[list[float]]]]:
        return {
            "base": lambda: chunk_latencies(app, "none", chunks),
            "sidecars": lambda: chunk_latencies(app, "sidecars-3", chunks),
            "fused": lambda: chunk_latencies(app, "fused-3", chunks),
            "one_hop": lambda: raw_hops(channel, 1, chunks),
            "three_hops": lambda: raw_hops(channel, 3, chunks),
            "parallel_hops": lambda: parallel_hops(channels, chunks),
        }

    await rounds(systems(min(n, WARMUP_CHUNKS)), 0, warmup=1)
    got = await rounds(systems(n), P3_ROUNDS, warmup=0)
    for each in channels:
        await each.close()
    for echo in echoes:
        echo.stop()

    def added_p99(kind: str) -> list[float]:
        return [pct(lat, 0.99) - pct(base, 0.5) for lat, base in zip(got[kind], got["base"], strict=True)]

    hop_p99 = [pct(lat, 0.99) for lat in got["one_hop"]]
    side_ratio, side_spread = figure([a / h for a, h in zip(added_p99("sidecars"), hop_p99, strict=True)])
    fused_ratio, fused_spread = figure([a / h for a, h in zip(added_p99("fused"), hop_p99, strict=True)])
    parallel_p99 = [pct(lat, 0.99) for lat in got["parallel_hops"]]
    par_ratio, par_spread = figure([a / p for a, p in zip(added_p99("sidecars"), parallel_p99, strict=True)])
    floor_ratio = figure(
        [pct(lat, 0.99) / pct(raw, 0.99) for lat, raw in zip(got["sidecars"], got["three_hops"], strict=True)]
    )[0]

    def pooled(kind: str, q: float) -> float:
        return pct([x for run in got[kind] for x in run], q)

    return {
        "p3_p50_ms": pooled("sidecars", 0.5),
        "p3_p99_ms": pooled("sidecars", 0.99),
        "p3_fused_p50_ms": pooled("fused", 0.5),
        "p3_fused_p99_ms": pooled("fused", 0.99),
        "p3_baseline_p50_ms": pooled("base", 0.5),
        "p3_baseline_p99_ms": pooled("base", 0.99),
        "p3_one_hop_p50_ms": pooled("one_hop", 0.5),
        "p3_one_hop_p99_ms": pooled("one_hop", 0.99),
        "p3_raw_grpc_floor_p50_ms": pooled("three_hops", 0.5),
        "p3_raw_grpc_floor_p99_ms": pooled("three_hops", 0.99),
        "p3_parallel_hops_p50_ms": pooled("parallel_hops", 0.5),
        "p3_parallel_hops_p99_ms": pooled("parallel_hops", 0.99),
        "p3_ratio_p99_vs_parallel_hops": par_ratio,
        "p3_ratio_p99_vs_parallel_hops_spread": par_spread,
        "p3_ratio_p99_vs_raw_floor": floor_ratio,
        "p3_added_p99_ms": statistics.median(added_p99("sidecars")),
        "p3_fused_added_p99_ms": statistics.median(added_p99("fused")),
        "p3_ratio_p99_vs_one_hop": side_ratio,
        "p3_ratio_p99_vs_one_hop_spread": side_spread,
        "p3_ratio_p99_fused_vs_one_hop": fused_ratio,
        "p3_ratio_p99_fused_vs_one_hop_spread": fused_spread,
    }


async def fused_only(n: int, n_rounds: int) -> dict[str, Any]:
    """P3 fused alone: no processors, the 3 fused in one sidecar and one raw hop, alternating,
    `n_rounds` rounds of `n` chunks after a warm-up round; the figure as `measure` computes it."""
    tmp = Path(tempfile.mkdtemp(prefix="pm-p3-"))
    echo, sidecar = f"unix://{tmp}/echo.sock", f"unix://{tmp}/s1.sock"
    procs = [start("bench.echo_server", echo), start("bench.processors", sidecar)]
    try:
        await procs[1].wait_ready()
        await asyncio.sleep(0.3)  # the echo server's start (it has no health service)
        agents = {"none": {}, "fused-3": {"outputProcessors": [f"s1/pass-{i}" for i in (1, 2, 3)]}}
        async with bench_app({"s1": sidecar}, agents) as app:
            channel = grpc.aio.insecure_channel(echo)

            cpu = {"orchestrator": 0.0, "sidecar": 0.0}
            assert procs[1].proc is not None
            sidecar_pid = procs[1].proc.pid

            async def fused(chunks: int) -> list[float]:
                """A fused run, its CPU (this process's, every thread; the sidecar's) counted."""
                t0, s0 = time.process_time(), process_cpu(sidecar_pid)
                lat = await chunk_latencies(app, "fused-3", chunks)
                cpu["orchestrator"] += time.process_time() - t0
                cpu["sidecar"] += process_cpu(sidecar_pid) - s0
                return lat

            def systems(chunks: int) -> dict[str, Callable[[], Awaitable[list[float]]]]:
                return {
                    "base": lambda: chunk_latencies(app, "none", chunks),
                    "fused": lambda: fused(chunks),
                    "one_hop": lambda: raw_hops(channel, 1, chunks),
                }

            await rounds(systems(min(n, WARMUP_CHUNKS)), 0, warmup=1)
            cpu = {"orchestrator": 0.0, "sidecar": 0.0}
            got = await rounds(systems(n), n_rounds, warmup=0)
            await channel.close()
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    added = [pct(lat, 0.99) - pct(base, 0.5) for lat, base in zip(got["fused"], got["base"], strict=True)]
    hop = [pct(lat, 0.99) for lat in got["one_hop"]]
    ratios = [a / h for a, h in zip(added, hop, strict=True)]
    ratio, spread = figure(ratios)
    fused = [x for run in got["fused"] for x in run]
    return {
        "p3_ratio_p99_fused_vs_one_hop": ratio,
        "spread": spread,
        "rounds": ratios,
        "fused_added_p99_ms": statistics.median(added),
        "one_hop_p99_ms": statistics.median(hop),
        "fused_p50_ms": pct(fused, 0.5),
        "fused_p99_ms": pct(fused, 0.99),
        "base_p50_ms": pct([x for run in got["base"] for x in run], 0.5),
        "fused_cpu_us_per_chunk": {k: v * 1e6 / (n * n_rounds) for k, v in cpu.items()},
        "loadavg": os.getloadavg()[0],
    }


async def alone(n: int) -> dict[str, Any]:
    """All of P3 (`measure`) as `make bench` runs it, with its own 3 sidecars and echo server."""
    tmp = Path(tempfile.mkdtemp(prefix="pm-p3-"))
    echo = f"unix://{tmp}/echo.sock"
    sidecars = {name: f"unix://{tmp}/{name}.sock" for name in ("s1", "s2", "s3")}
    procs = [start("bench.echo_server", echo), *(start("bench.processors", a) for a in sidecars.values())]
    try:
        for proc in procs[1:]:
            await proc.wait_ready()
        await asyncio.sleep(0.3)  # the echo server's start
        agents = {
            "none": {},
            "sidecars-3": {"outputProcessors": [f"{s}/pass-{i}" for i, s in enumerate(sidecars, start=1)]},
            "fused-3": {"outputProcessors": [f"s1/pass-{i}" for i in (1, 2, 3)]},
        }
        async with bench_app(sidecars, agents) as app:
            results = await measure(app, echo, n)
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    results["loadavg"] = os.getloadavg()[0]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fused-only", action="store_true", help="P3 fused alone (else all of P3)")
    parser.add_argument("--chunks", type=int, default=300, help="chunks a round (300 as in make bench)")
    parser.add_argument("--rounds", type=int, default=P3_ROUNDS, help="with --fused-only")
    args = parser.parse_args()
    run = fused_only(args.chunks, args.rounds) if args.fused_only else alone(args.chunks)
    print(json.dumps(asyncio.run(run)))


if __name__ == "__main__":
    main()
