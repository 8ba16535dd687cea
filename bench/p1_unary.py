"""P1: one no-op unary hook vs a raw grpc.aio echo of the same bytes."""

from __future__ import annotations

import time

import grpc

from bench.echo_server import METHOD
from bench.harness import handles_for, pct
from procmesh import ProcessorClient, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import GrpcHookCaller, OrchestratorMetrics, RunInfo


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


async def measure(transports: list[tuple[str, str, str]], n: int) -> dict[str, object]:
    """P1 over each (transport, sdk address, echo address): the figures and the p50 ratio."""
    results: dict[str, object] = {}
    for transport, sdk_addr, echo_addr in transports:
        r = await p1(sdk_addr, echo_addr, n)
        results[f"p1_{transport}"] = r
        results[f"p1_ratio_{transport}"] = r["sdk_p50_us"] / r["raw_p50_us"]
    return results
