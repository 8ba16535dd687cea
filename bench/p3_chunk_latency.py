"""P3: added latency per chunk at 50 chunks/s through 3 sidecars, against a raw gRPC floor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from bench.echo_server import STREAM_METHOD
from bench.harness import agent_with, pct
from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import ModelRequest, ProcessorHandle, ScriptedModel


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


async def measure(side: list[ProcessorHandle], echo_address: str, n: int) -> dict[str, float]:
    """Per-chunk latency with no processors, through the sidecars, and through raw echo hops."""
    base = await chunk_latencies([], n)
    lat = await chunk_latencies(side, n)
    raw = await raw_chain_latencies(echo_address, n)
    return {
        "p3_p50_ms": pct(lat, 0.5),
        "p3_p99_ms": pct(lat, 0.99),
        "p3_baseline_p50_ms": pct(base, 0.5),
        "p3_baseline_p99_ms": pct(base, 0.99),
        "p3_raw_grpc_floor_p50_ms": pct(raw, 0.5),
        "p3_raw_grpc_floor_p99_ms": pct(raw, 0.99),
        "p3_ratio_p99_vs_raw_floor": pct(lat, 0.99) / pct(raw, 0.99),
        "p3_added_p99_ms": pct(lat, 0.99) - pct(base, 0.5),
    }
