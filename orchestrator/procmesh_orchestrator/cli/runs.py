"""`procmesh runs decisions RUN` (a run's decision record) and `procmesh runs decisions --since T`
(every run's decisions in a time range), read from the config's `storage` section: the store the
orchestrator writes them to with ``decisions.record`` (issue 31)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store code is imported when the command runs, not for every `procmesh`
    from procmesh_orchestrator.store import Decision


DEFAULT_LIMIT = 1000
"""Decisions `--since` prints at most, unless `--limit` says."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `runs` command and its action."""
    runs = sub.add_parser("runs", help="read what the store keeps of runs (the config's storage)")
    actions = runs.add_subparsers(dest="action", required=True)
    decisions = actions.add_parser(
        "decisions", help="a run's processor decisions in order, or every run's in a time range"
    )
    decisions.add_argument("run", nargs="?", help="the run id (or --since)")
    decisions.add_argument("--since", help="ISO 8601: decisions from this time on, every run's, oldest first")
    decisions.add_argument("--until", help="ISO 8601: and before this time (default: now)")
    decisions.add_argument("--agent", help="with --since: only this agent's runs")
    decisions.add_argument(
        "--limit",
        type=int,
        help="with --since: at most this many (1 to 9999, default 1000); more in the range: a note on stderr",
    )
    decisions.add_argument("--config", help="YAML configuration file (default: PROCMESH_CONFIG_FILE)")
    decisions.add_argument("--json", action="store_true", help="one JSON object per line")
    return runs


def _line(d: Decision, run: bool) -> str:
    part = "" if d.part is None else f"#{d.part}"
    outcome = f"{d.outcome}:{d.would}" if d.would else d.outcome
    where = f"{d.sidecar}/{d.processor} ({d.entry})"
    fields = [d.at, *([d.run_id] if run else []), f"step {d.step}", f"{d.hook}{part}", where, outcome]
    return "\t".join([*fields, f"{d.latency_ms:.1f}ms", d.seen[:16]])


async def run(args: argparse.Namespace) -> int:
    """Print the decisions; exit 1 when the store keeps none of the run (2: neither RUN nor --since)."""
    from procmesh_orchestrator.cli._limit import limit_refused
    from procmesh_orchestrator.config import load_config
    from procmesh_orchestrator.service.api.decisions import MAX_BETWEEN, between_page
    from procmesh_orchestrator.store import open_store

    if (args.run is None) == (args.since is None):
        print("procmesh runs decisions: give a RUN or --since, not both", file=sys.stderr, flush=True)
        return 2
    ranged = [flag for flag in ("until", "agent", "limit") if getattr(args, flag) is not None]
    if args.run is not None and ranged:  # a run's record is all of it: they would change nothing
        flags = ", ".join(f"--{flag}" for flag in ranged)
        print(
            f"procmesh runs decisions: {flags} go with --since, not with a RUN", file=sys.stderr, flush=True
        )
        return 2
    if args.limit is None:
        args.limit = DEFAULT_LIMIT
    if limit_refused("runs decisions", args.limit, MAX_BETWEEN):
        return 2
    store = open_store(load_config(args.config).storage)
    await store.start()
    more = False
    try:
        if args.run is not None:
            found = await store.run_decisions(args.run)
        else:
            until = args.until or datetime.now(UTC).isoformat()
            found, more = await between_page(store, args.since, until, args.agent, args.limit)
    finally:
        await store.close()
    if not found and args.run is not None:
        print(
            f"procmesh runs: no decision record of run {args.run!r} in the store", file=sys.stderr, flush=True
        )
        return 1
    for d in found:
        if args.json:
            print(json.dumps({"runId": d.run_id, **d.to_json()}, ensure_ascii=False))
        else:
            print(_line(d, run=args.run is None))
    if more:  # the lines above are the range's first ones only: never a cut list passed off as whole
        print(
            f"procmesh runs decisions: the range holds more than --limit {args.limit} decisions; "
            "these are its first (oldest): narrow --since/--until or raise --limit",
            file=sys.stderr,
            flush=True,
        )
    return 0
