"""`procmesh replay`: recorded runs through a candidate config (another file, or the same with
`--set` changes), the model and tools answered from the record, against the candidate's real
sidecars; the decision diff per run and a summary (`procmesh_orchestrator.replay`, issue 31).
Exit 0: no run changes; 3: a run changes (or stops where the record no longer applies); 2: an
error (an unknown run, one recorded without inputs, a candidate that does not start)."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime

from procmesh_orchestrator.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `replay` command."""
    replay = sub.add_parser(
        "replay",
        help="replay recorded runs through a candidate config and print what its processors decide otherwise",
        epilog="exit status: 0 no run changes, 3 a run changes (or stops where the record no longer "
        "applies), 2 an error (an unknown run, one recorded without inputs, a bad candidate)",
    )
    replay.add_argument("run", nargs="?", help="the recorded run's id (or --agent with --since)")
    replay.add_argument(
        "--config", help="the candidate's YAML configuration file (default: PROCMESH_CONFIG_FILE)"
    )
    replay.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the candidate's KEY (a dotted path: agents.A.inputProcessors) to VALUE (YAML), as a "
        "PROCMESH_CONFIG__ variable would; repeatable",
    )
    replay.add_argument(
        "--store-config",
        help="the configuration whose storage holds the record (default: PROCMESH_CONFIG_FILE, "
        "else the candidate's)",
    )
    replay.add_argument("--agent", help="replay this agent's recorded runs (with --since)")
    replay.add_argument("--since", help="ISO 8601: runs recorded from this time on")
    replay.add_argument("--until", help="ISO 8601: and before this time (default: now)")
    replay.add_argument("--json", action="store_true", help="the report as one JSON object (for CI)")
    return replay


def _overrides(entries: list[str]) -> dict[str, str]:
    """``--set agents.a.maxSteps=3`` as the variable ``PROCMESH_CONFIG__agents__a__maxSteps`` (keys
    match ignoring case and underscores, `config.loading.apply_env_overrides`)."""
    from procmesh_orchestrator.config import ENV_PREFIX

    out = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {entry!r}: give KEY=VALUE, KEY a dotted path (agents.A.maxSteps)")
        out[ENV_PREFIX + "__".join(key.split("."))] = value
    return out


async def run(args: argparse.Namespace) -> int:
    """Replay and print the report; `EXIT_CHANGED` when a run changes."""
    from procmesh_orchestrator.config import load_config
    from procmesh_orchestrator.replay import EXIT_CHANGED, EXIT_SAME, Selection, replay
    from procmesh_orchestrator.store import open_store

    path = args.config or os.environ.get("PROCMESH_CONFIG_FILE")
    if not path:
        raise ConfigError("procmesh replay: --config CANDIDATE.yaml (or PROCMESH_CONFIG_FILE) is required")
    candidate = load_config(path, {**os.environ, **_overrides(args.set)})
    recorded_in = args.store_config or os.environ.get("PROCMESH_CONFIG_FILE")
    storage = load_config(recorded_in).storage if recorded_in else candidate.storage
    until = args.until
    if args.run is None and until is None:
        until = datetime.now(UTC).isoformat()
    selection = Selection(args.run, args.agent, args.since, until)
    selection.check()
    store = open_store(storage)
    await store.start()
    try:
        report = await replay(store, candidate, selection)
    finally:
        await store.close()
    print(json.dumps(report.to_json(), ensure_ascii=False) if args.json else report.text(), flush=True)
    return EXIT_CHANGED if report.changed else EXIT_SAME
