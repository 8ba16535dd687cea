"""P7: the per-chunk cost of each pass-through processor in lanes of 1, 3, 6 and 10.

A lane of k speculative pass-through processors spread over the 3 sidecars in contiguous blocks
(10 = 4 + 3 + 3), as a deployment groups its processors: consecutive ones in one sidecar are fused,
the sidecars run speculatively side by side. Per round: (the run's ms - the same run with no
processors) / (deltas * k), in microseconds; the figure per k is the median over rounds.
A round takes a fraction of a second and its per-processor figures spread by about a third
(a run of 10 ms with one processor is at the mercy of one scheduling delay), more than the gap
the goal asks about, so P7 runs three times the bench's rounds (`P7_ROUNDS`: a few seconds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import ROUNDS, agent, checked_run, deltas, figure, rounds, timed
from procmesh_orchestrator import App, ScriptedModel

LANES = (1, 3, 6, 10)
P7_ROUNDS = 3 * ROUNDS
"""Rounds of P7: its figures' spread is wide and a round is short (module doc)."""


def lane(k: int, sidecars: list[str]) -> list[str]:
    """k processors over the sidecars in contiguous blocks, the first blocks one longer."""
    base, extra = divmod(k, len(sidecars))
    out: list[str] = []
    for i, name in enumerate(sidecars):
        size = base + (1 if i < extra else 0)
        out += [f"{name}/pass-{len(out) + j + 1}" for j in range(size)]
    return out


async def measure(app: App, n_deltas: int) -> dict[str, Any]:
    """The per-processor per-chunk cost per lane length, and its spread."""

    def run(agent_id: str) -> Callable[[], Awaitable[float]]:
        return lambda: timed(
            lambda: checked_run(agent(app, agent_id, ScriptedModel(deltas(n_deltas))), n_deltas)
        )

    ms = await rounds({"none": run("none"), **{str(k): run(f"pass-{k}") for k in LANES}}, P7_ROUNDS)
    costs, spreads = [], []
    for k in LANES:
        per_round = zip(ms[str(k)], ms["none"], strict=True)
        us, spread = figure([(t - n) * 1000 / (n_deltas * k) for t, n in per_round])
        costs.append(us)
        spreads.append(spread)
    return {
        "p7_lanes": list(LANES),
        "p7_us_per_chunk_per_processor": costs,
        "p7_us_per_chunk_per_processor_spread": spreads,
    }
