"""The table `make bench` prints: each measure's figures next to its goal."""

from __future__ import annotations

from typing import Any


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
