"""P2: a 1,000-delta streamed run through 3 pass-through speculative sidecars, against the
reference engine (@mastra/core) with 3 in-process pass-through processors, runs alternating;
beside it, the same run with no processors and with the 3 processors hosted in-process."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import Reference, agent, checked_run, deltas, figure, rounds, timed
from procmesh_orchestrator import App, ScriptedModel


def ours(app: App, agent_id: str, n_deltas: int) -> Callable[[], Awaitable[float]]:
    return lambda: timed(lambda: checked_run(agent(app, agent_id, ScriptedModel(deltas(n_deltas))), n_deltas))


async def measure(app: App, reference: Reference | None, n_deltas: int) -> dict[str, Any]:
    """Median ms of each setup; the sidecars' ratio to the reference is the median of the rounds'."""
    systems = {
        "none": ours(app, "none", n_deltas),
        "sidecars": ours(app, "sidecars-3", n_deltas),
        "inprocess": ours(app, "inprocess-3", n_deltas),
    }
    if reference is not None:
        systems["reference"] = lambda: reference.run(run="stream", deltas=n_deltas, processors=3)
    ms = await rounds(systems)
    side = ms["sidecars"]
    results: dict[str, Any] = {
        "p2_ms_no_processors": statistics.median(ms["none"]),
        "p2_ms_sidecars": statistics.median(side),
        "p2_ms_inprocess": statistics.median(ms["inprocess"]),
        "p2_ms_reference": None,
        "p2_ratio_vs_reference": None,
        "p2_ratio_vs_reference_spread": None,
    }
    if reference is not None:
        ratio, spread = figure([s / r for s, r in zip(side, ms["reference"], strict=True)])
        results.update(
            p2_ms_reference=statistics.median(ms["reference"]),
            p2_ratio_vs_reference=ratio,
            p2_ratio_vs_reference_spread=spread,
        )
    results["p2_ratio_vs_no_processors"] = figure([s / n for s, n in zip(side, ms["none"], strict=True)])[0]
    return results
