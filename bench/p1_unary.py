"""P1: one no-op unary hook vs a raw grpc.aio echo of the same bytes, in alternating batches; beside
it, the sidecar alone: a raw grpc.aio client sending it the request's bytes (no orchestrator client)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from bench.echo_server import METHOD
from bench.harness import ROUNDS, figure, pct, rounds
from procmesh import SERVICE_NAME
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator import App, RunInfo
from procmesh_orchestrator.processors import GrpcHookCaller, wire
from procmesh_orchestrator.run.hooks import InputStepArgs


def p1_args() -> InputStepArgs:
    """processInputStep's arguments carrying ~1 KB of messages."""
    texts = [
        "You are a careful assistant." * 3,
        "What is the weather like in Paris today? " * 4,
        "It is sunny and 21C in Paris, with a light breeze from the west. " * 3,
        "Thanks! " * 10,
    ]
    messages = [
        {
            "id": f"m{i}",
            "role": "user" if i % 2 else "assistant",
            "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
        }
        for i, text in enumerate(texts)
    ]
    return InputStepArgs(
        model="scripted/model",
        messages=messages,
        system_messages=[],
        tools=[],
        tool_choice=None,
        active_tools=None,
        provider_options={},
        model_settings={},
        steps=[],
    )


def batch(
    call: Callable[[], Awaitable[Any]], size: int, cpu: list[float] | None = None
) -> Callable[[], Awaitable[list[float]]]:
    """`size` calls one after another; their latencies in seconds. With `cpu`, each batch also
    appends the CPU this thread (the event loop's) spent per call, in seconds."""

    async def run() -> list[float]:
        out = []
        c0 = time.thread_time()
        for _ in range(size):
            t0 = time.perf_counter()
            await call()
            out.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) / size)
        return out

    return run


async def p1(app: App, sidecar: str, address_echo: str, n: int) -> dict[str, Any]:
    args = p1_args()
    payload = wire.build_request(args).SerializeToString()
    [handle] = app.resolve([f"{sidecar}/noop"])
    caller = GrpcHookCaller(RunInfo(run_id="bench", agent_id="bench", request_context={}), app.metrics)
    channel = grpc.aio.insecure_channel(address_echo)
    echo = channel.unary_unary(METHOD)
    direct = grpc.aio.insecure_channel(handle.client.address)
    hook = direct.unary_unary(f"/{SERVICE_NAME}/ProcessInputStep")
    request = wire.build_request(args)
    request.context.CopyFrom(tpb.RunContext(processor_id="noop", run_id="bench", agent_id="bench"))
    addressed = request.SerializeToString()

    async def sdk_call() -> None:
        await caller.call(handle, args)

    async def raw_call() -> None:
        await echo(payload, timeout=30.0)

    async def sidecar_call() -> None:
        await hook(addressed, timeout=30.0)

    size = max(10, n // ROUNDS)
    # the event loop's CPU per call, SDK calls against a raw client sending the same request's
    # bytes to the same sidecar: the orchestrator client's own cost between real calls
    cpu: dict[str, list[float]] = {"sdk": [], "sidecar": []}
    got = await rounds(
        {
            "sdk": batch(sdk_call, size, cpu["sdk"]),
            "raw": batch(raw_call, size),
            "sidecar": batch(sidecar_call, size, cpu["sidecar"]),
        }
    )
    cpu = {k: v[1:] for k, v in cpu.items()}  # the warm-up round's batches
    await channel.close()
    await direct.close()

    def against_raw(kind: str) -> tuple[float, dict[str, float]]:
        return figure(
            [statistics.median(s) / statistics.median(r) for s, r in zip(got[kind], got["raw"], strict=True)]
        )

    ratio, spread = against_raw("sdk")
    alone, alone_spread = against_raw("sidecar")
    sdk = [x for b in got["sdk"] for x in b]
    raw = [x for b in got["raw"] for x in b]
    return {
        "bytes": len(payload),
        "sdk_p50_us": pct(sdk, 0.5) * 1e6,
        "sdk_p99_us": pct(sdk, 0.99) * 1e6,
        "raw_p50_us": pct(raw, 0.5) * 1e6,
        "raw_p99_us": pct(raw, 0.99) * 1e6,
        "sidecar_alone_p50_us": pct([x for b in got["sidecar"] for x in b], 0.5) * 1e6,
        "client_cpu_us_above_raw": statistics.median(
            s - r for s, r in zip(cpu["sdk"], cpu["sidecar"], strict=True)
        )
        * 1e6,
        "ratio": ratio,
        "spread": spread,
        "alone": alone,
        "alone_spread": alone_spread,
    }


async def measure(app: App, transports: list[tuple[str, str, str]], n: int) -> dict[str, object]:
    """P1 over each (transport, sidecar name, echo address): the figures and the median ratio of
    the batches' p50s (batch of SDK calls, batch of raw calls, alternating)."""
    results: dict[str, object] = {}
    for transport, sidecar, echo_addr in transports:
        r = await p1(app, sidecar, echo_addr, n)
        results[f"p1_ratio_{transport}"] = r.pop("ratio")
        results[f"p1_ratio_{transport}_spread"] = r.pop("spread")
        results[f"p1_sidecar_alone_ratio_{transport}"] = r.pop("alone")
        results[f"p1_sidecar_alone_ratio_{transport}_spread"] = r.pop("alone_spread")
        results[f"p1_{transport}"] = r
    return results
