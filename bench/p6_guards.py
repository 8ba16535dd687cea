"""P6: three input guards that each take 50 ms (speculative, one sidecar each).

What they add to a run, against what the same three add in the reference engine, where they run
one after another; and the time to the first streamed chunk when the model's first chunk takes
100 ms, with the optimistic first step (the model starts while the guards run) against the
sequential engine (guards one after another, then the model).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bench.harness import Reference, agent, checked_run, figure, rounds, timed
from bench.processors import GUARD_SECONDS, GUARDS
from procmesh_orchestrator import App, ModelRequest, ScriptedModel

FIRST_CHUNK_SECONDS = 0.1


class SlowStartModel(ScriptedModel):
    """A model whose first chunk takes 100 ms, then a few quick ones."""

    def __init__(self) -> None:
        super().__init__([])

    async def stream(self, request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(request)
        await asyncio.sleep(FIRST_CHUNK_SECONDS)
        for word in ("all", " clear"):
            yield {"type": "text-delta", "payload": {"id": "t", "text": word}}
        yield {"type": "finish", "payload": {"finishReason": "stop", "usage": {}}}


def whole_run(app: App, agent_id: str) -> Callable[[], Awaitable[float]]:
    return lambda: timed(lambda: checked_run(agent(app, agent_id, ScriptedModel([{"text": "ok"}])), 1))


def first_chunk(app: App, agent_id: str) -> Callable[[], Awaitable[float]]:
    """Milliseconds from the call to the first text delta the caller reads (the run then ends)."""

    async def run() -> float:
        t0 = time.perf_counter()
        stream = agent(app, agent_id, SlowStartModel()).stream("go")
        first = None
        async for chunk in stream:
            if chunk["type"] == "text-delta" and first is None:
                first = (time.perf_counter() - t0) * 1000
        result = await stream.result()
        if result.error or first is None:
            raise RuntimeError(f"bench run failed: {result.error}")
        return first

    return run


async def measure(app: App, reference: Reference | None) -> dict[str, Any]:
    """The added time per round (with guards - without, each engine) and first-chunk times."""
    systems: dict[str, Callable[[], Awaitable[float]]] = {
        "none": whole_run(app, "none"),
        "speculative": whole_run(app, "guards"),
        "sequential": whole_run(app, "guards-sequential"),
    }
    if reference is not None:
        systems["ref_none"] = lambda: reference.run(run="guards", guards=0, delayMs=0)
        systems["ref_guards"] = lambda: reference.run(
            run="guards", guards=GUARDS, delayMs=GUARD_SECONDS * 1000
        )
    ms = await rounds(systems)
    added = [g - n for g, n in zip(ms["speculative"], ms["none"], strict=True)]
    added_seq = [g - n for g, n in zip(ms["sequential"], ms["none"], strict=True)]
    results: dict[str, Any] = {
        "p6_added_ms_speculative": statistics.median(added),
        "p6_added_ms_sequential": statistics.median(added_seq),
        "p6_added_ms_reference": None,
        "p6_ratio_vs_reference": None,
        "p6_ratio_vs_reference_spread": None,
    }
    if reference is not None:
        ref_added = [g - n for g, n in zip(ms["ref_guards"], ms["ref_none"], strict=True)]
        ratio, spread = figure([a / r for a, r in zip(added, ref_added, strict=True)])
        results.update(
            p6_added_ms_reference=statistics.median(ref_added),
            p6_ratio_vs_reference=ratio,
            p6_ratio_vs_reference_spread=spread,
        )
    first = await rounds(
        {
            "optimistic": first_chunk(app, "guards-optimistic"),
            "speculative": first_chunk(app, "guards"),
            "sequential": first_chunk(app, "guards-sequential"),
        }
    )
    ratio, spread = figure([o / s for o, s in zip(first["optimistic"], first["sequential"], strict=True)])
    results.update(
        p6_first_chunk_ms_optimistic=statistics.median(first["optimistic"]),
        p6_first_chunk_ms_speculative=statistics.median(first["speculative"]),
        p6_first_chunk_ms_sequential=statistics.median(first["sequential"]),
        p6_first_chunk_ratio_optimistic=ratio,
        p6_first_chunk_ratio_optimistic_spread=spread,
    )
    return results
