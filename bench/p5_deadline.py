"""P5: a sidecar slower than the run's deadline: how far past the deadline does the run end?"""

from __future__ import annotations

import time

from bench.harness import agent, pct
from procmesh_orchestrator import App, CallOptions, ScriptedModel


async def measure(app: App, rounds: int, deadline: float = 0.2) -> dict[str, float]:
    """The overshoot past `deadline` (ms) of runs whose input processor outlasts it."""
    overshoot = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        stream = agent(app, "slow-input", ScriptedModel([{"text": "x"}])).stream(
            "go", CallOptions(timeout=deadline)
        )
        async for _chunk in stream:
            pass
        result = await stream.result()
        overshoot.append((time.perf_counter() - t0 - deadline) * 1000)
        if result.error is None:
            raise RuntimeError("P5: the slow processor did not fail the run")
    return {
        "p5_deadline_overshoot_ms_p50": pct(overshoot, 0.5),
        "p5_deadline_overshoot_ms_max": max(overshoot),
    }
