"""The table `make bench` prints: each measure's figures next to its goal, with the spread of the
rounds' ratios (min-max) where the figure is a median of them."""

from __future__ import annotations

from typing import Any


def f(v: Any, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def spread(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s:
        return "no rounds"
    return f"rounds {s['rounds']:.0f}, {f(s['min'], digits)}-{f(s['max'], digits)}"


def verdict(v: float | None, goal: float) -> str:
    return "" if v is None else ("met" if v <= goal else "MISSED")


def rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for transport, name in (("uds", "unix socket"), ("tcp", "TCP")):
        p1 = r[f"p1_{transport}"]
        ratio = r[f"p1_ratio_{transport}"]
        out.append(
            (
                f"P1 unary hook, {name}",
                f"sdk p50 {f(p1['sdk_p50_us'], 0)} us / p99 {f(p1['sdk_p99_us'], 0)} us; "
                f"raw echo p50 {f(p1['raw_p50_us'], 0)} us / p99 {f(p1['raw_p99_us'], 0)} us; "
                f"the sidecar alone (a raw client) p50 {f(p1['sidecar_alone_p50_us'], 0)} us: "
                f"{f(r[f'p1_sidecar_alone_ratio_{transport}'])}x the echo "
                f"({spread(r[f'p1_sidecar_alone_ratio_{transport}_spread'])})",
                f"{f(ratio)}x ({spread(r[f'p1_ratio_{transport}_spread'])}; goal <= 1.25x) "
                f"{verdict(ratio, 1.25)}",
            )
        )
    out += [
        (
            "P2 1,000 deltas, 3 speculative sidecars",
            f"{f(r['p2_ms_sidecars'], 1)} ms; reference {f(r['p2_ms_reference'], 1)} ms; "
            f"none {f(r['p2_ms_no_processors'], 1)} ms; in-process {f(r['p2_ms_inprocess'], 1)} ms",
            f"{f(r['p2_ratio_vs_reference'])}x reference ({spread(r['p2_ratio_vs_reference_spread'])};"
            f" goal <= 0.5x) {verdict(r['p2_ratio_vs_reference'], 0.5)}",
        ),
        (
            "P3 50 chunks/s, 3 speculative sidecars",
            f"added p99 {f(r['p3_added_p99_ms'], 3)} ms (p50 {f(r['p3_p50_ms'], 3)}, p99 "
            f"{f(r['p3_p99_ms'], 3)} ms; no processors p50 {f(r['p3_baseline_p50_ms'], 3)} ms); "
            f"one raw bidi hop p50 {f(r['p3_one_hop_p50_ms'], 3)} / p99 {f(r['p3_one_hop_p99_ms'], 3)} ms",
            f"{f(r['p3_ratio_p99_vs_one_hop'])}x one hop ({spread(r['p3_ratio_p99_vs_one_hop_spread'])};"
            " reported)",
        ),
        (
            "P3 the 3 sidecars vs 3 parallel raw hops",
            f"added p99 {f(r['p3_added_p99_ms'], 3)} ms; 3 parallel raw bidi hops (3 echo processes) "
            f"p50 {f(r['p3_parallel_hops_p50_ms'], 3)} / p99 {f(r['p3_parallel_hops_p99_ms'], 3)} ms",
            f"{f(r['p3_ratio_p99_vs_parallel_hops'])}x "
            f"({spread(r['p3_ratio_p99_vs_parallel_hops_spread'])}; goal <= 1.25x) "
            f"{verdict(r['p3_ratio_p99_vs_parallel_hops'], 1.25)}",
        ),
        (
            "P3 50 chunks/s, the 3 fused in one sidecar",
            f"added p99 {f(r['p3_fused_added_p99_ms'], 3)} ms (p50 {f(r['p3_fused_p50_ms'], 3)}, p99 "
            f"{f(r['p3_fused_p99_ms'], 3)} ms); 3 raw hops in a row p99 "
            f"{f(r['p3_raw_grpc_floor_p99_ms'], 3)} ms",
            f"{f(r['p3_ratio_p99_fused_vs_one_hop'])}x one hop "
            f"({spread(r['p3_ratio_p99_fused_vs_one_hop_spread'])}; goal <= 1.25x) "
            f"{verdict(r['p3_ratio_p99_fused_vs_one_hop'], 1.25)}",
        ),
        (
            f"P4 {r['p4_runs']} concurrent runs",
            f"{f(r['p4_runs_per_s'], 1)} runs/s vs in-process {f(r['p4_runs_per_s_inprocess'], 1)} runs/s;"
            f" peak RSS orchestrator {f(r['p4_peak_rss_mb_orchestrator'], 0)} MiB"
            f" ({f(r.get('p4_rss_mb_orchestrator_at_start'), 0)} at its start), sidecars "
            f"{r['p4_peak_rss_mb_sidecars']} MiB",
            f"errors {r['p4_errors']} (goal 0) {'met' if r['p4_errors'] == 0 else 'MISSED'}",
        ),
        (
            "P5 slow sidecar vs a 200 ms run deadline",
            f"run ends {f(r['p5_deadline_overshoot_ms_p50'], 1)} ms past it (p50), "
            f"{f(r['p5_deadline_overshoot_ms_max'], 1)} ms at most",
            f"max {f(r['p5_deadline_overshoot_ms_max'], 1)} ms (goal <= 50 ms) "
            f"{verdict(r['p5_deadline_overshoot_ms_max'], 50)}",
        ),
        (
            "P6 three 50 ms speculative input guards",
            f"add {f(r['p6_added_ms_speculative'], 1)} ms; sequential here "
            f"{f(r['p6_added_ms_sequential'], 1)} ms; reference {f(r['p6_added_ms_reference'], 1)} ms",
            f"{f(r['p6_ratio_vs_reference'])}x reference ({spread(r['p6_ratio_vs_reference_spread'])};"
            f" goal <= 0.45x) {verdict(r['p6_ratio_vs_reference'], 0.45)}",
        ),
        (
            "P6 first chunk, 100 ms model, optimistic",
            f"{f(r['p6_first_chunk_ms_optimistic'], 1)} ms; speculative guards "
            f"{f(r['p6_first_chunk_ms_speculative'], 1)} ms; sequential "
            f"{f(r['p6_first_chunk_ms_sequential'], 1)} ms",
            f"{f(r['p6_first_chunk_ratio_optimistic'])}x sequential "
            f"({spread(r['p6_first_chunk_ratio_optimistic_spread'])}; goal <= 0.5x) "
            f"{verdict(r['p6_first_chunk_ratio_optimistic'], 0.5)}",
        ),
    ]
    costs = r["p7_us_per_chunk_per_processor"]
    out.append(
        (
            "P7 us per chunk per processor",
            ", ".join(f"{k}: {f(c, 1)}" for k, c in zip(r["p7_lanes"], costs, strict=True)),
            f"at 10 {f(costs[-1], 1)} vs at 1 {f(costs[0], 1)} (goal: no higher) "
            f"{verdict(costs[-1], costs[0])}",
        )
    )
    out.append(
        (
            "P8 HTTP request, kept-alive vs fresh",
            f"p50 {f(r['p8_ms_p50_kept_alive'], 2)} ms kept alive, {f(r['p8_ms_p50_fresh'], 2)} ms on a "
            f"fresh connection ({r['p8_requests_per_batch']} a batch)",
            f"{f(r['p8_ratio_kept_alive_vs_fresh'])}x fresh "
            f"({spread(r['p8_ratio_kept_alive_vs_fresh_spread'])}; goal <= 1.25x) "
            f"{verdict(r['p8_ratio_kept_alive_vs_fresh'], 1.25)}",
        )
    )
    out += guard_planner_rows(r)
    for store in ("sqlite", "postgres"):
        for n in r.get("p9_sizes", []):
            k = f"p9_{store}_{n}"
            goal = n == 100_000 and store == "postgres"
            out.append(
                (
                    f"P9 recall, {store}, {n} messages",
                    f"search p50 {f(r[k + '_search_ms_p50'], 2)} ms, with the ranges p50 "
                    f"{f(r[k + '_recall_ms_p50'], 2)} ms (p95 {f(r[k + '_recall_ms_p95'], 2)}); query "
                    f"embedding p50 {f(r[k + '_embed_ms_p50'], 2)} ms; first search "
                    f"{f(r[k + '_first_search_s'], 1)} s; found the dog {r[k + '_found_dog']}",
                    f"{f(r[k + '_recall_ms_p50'], 2)} ms"
                    + (f" (goal <= 20 ms) {verdict(r[k + '_recall_ms_p50'], 20)}" if goal else " (reported)"),
                )
            )
    return out


def guard_planner_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """P8 of issue 33: five LLM-judged guards (bench/p10_guards_planner.py)."""
    ratio, added = r["p8_judge_calls_ratio_vs_reference"], r["p8_first_chunk_added_ms"]
    trip, short = r["p8_judge_round_trip_ms"], r["p8_first_chunk_short_added_ms"]
    return [
        (
            "P8 five judged guards, judge calls",
            f"{r['p8_judge_calls_procmesh']} judge calls vs reference {r['p8_judge_calls_reference']} "
            f"(10 turns, history re-sent, a {r['p8_answer_chars']}-character answer)",
            f"{f(ratio)}x reference (goal <= 0.33x) {verdict(ratio, 1 / 3)}",
        ),
        (
            "P8 five judged guards, first chunk",
            f"added {f(added, 1)} ms ({spread(r['p8_first_chunk_added_ms_spread'], 0)}); guarded "
            f"{f(r['p8_first_chunk_ms_guarded'], 1)} ms, bare {f(r['p8_first_chunk_ms_bare'], 1)} ms",
            f"{f(added, 1)} ms vs one judge round trip {f(trip, 1)} ms (goal: no more) "
            f"{verdict(added, trip)}",
        ),
        (
            "P8 five judged guards, a short message's first chunk",
            f"added {f(short, 1)} ms ({spread(r['p8_first_chunk_short_added_ms_spread'], 0)}): one "
            "message under 10 characters, which the language detector does not judge",
            f"{f(short, 1)} ms vs one judge round trip {f(trip, 1)} ms (goal: no more) "
            f"{verdict(short, trip)}",
        ),
        (
            "P8 five judged guards, golden set",
            f"{r['p8_golden_windows']} labelled windows, each guard alone vs the five together",
            f"verdicts equal: {r['p8_verdicts_equal']} (goal: true) "
            f"{'met' if r['p8_verdicts_equal'] else 'MISSED'}",
        ),
    ]


def table(r: dict[str, Any]) -> str:
    lines = rows(r)
    width = max(len(a) for a, _, _ in lines)
    return "\n".join(f"{a:<{width}}  {b}\n{'':<{width}}  -> {c}" for a, b, c in lines)
