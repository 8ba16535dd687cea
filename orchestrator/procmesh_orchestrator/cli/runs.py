"""`procmesh runs decisions RUN`: a run's decision record (issue 31), read from the config's
`storage` section (the store the orchestrator writes it to with ``decisions.record``)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `runs` command and its action."""
    runs = sub.add_parser("runs", help="read what the store keeps of runs (the config's storage)")
    actions = runs.add_subparsers(dest="action", required=True)
    decisions = actions.add_parser("decisions", help="a run's processor decisions, in order")
    decisions.add_argument("run", help="the run id")
    decisions.add_argument("--config", help="YAML configuration file (default: PROCMESH_CONFIG_FILE)")
    decisions.add_argument("--json", action="store_true", help="one JSON object per line")
    return runs


async def run(args: argparse.Namespace) -> int:
    """Print the run's decisions; exit 1 when the store keeps none of it."""
    from procmesh_orchestrator.config import load_config
    from procmesh_orchestrator.store import open_store

    store = open_store(load_config(args.config).storage)
    await store.start()
    try:
        found = await store.run_decisions(args.run)
    finally:
        await store.close()
    if not found:
        print(f"procmesh runs: no decision record of run {args.run!r} in the store", flush=True)
        return 1
    for d in found:
        if args.json:
            print(json.dumps(d.to_json(), ensure_ascii=False))
            continue
        part = "" if d.part is None else f"#{d.part}"
        outcome = f"{d.outcome}:{d.would}" if d.would else d.outcome
        where = f"{d.sidecar}/{d.processor} ({d.entry})"
        latency = f"{d.latency_ms:.1f}ms"
        print(f"{d.at}\tstep {d.step}\t{d.hook}{part}\t{where}\t{outcome}\t{latency}\t{d.seen[:16]}")
    return 0
