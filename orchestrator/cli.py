"""The `procmesh` command: demo, generate, stream, scenario run."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from orchestrator.errors import OrchestratorError


def _scenario_run(args: argparse.Namespace) -> int:
    from orchestrator.scenario import load, run_scenario

    data = load(args.file)
    trace = asyncio.run(run_scenario(data, args.file))
    json.dump(trace, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


async def _call(args: argparse.Namespace) -> int:
    from orchestrator.app import App
    from orchestrator.config import load_config

    async with App(load_config(args.config)) as app:
        agent = app.agent(args.agent)
        if args.command == "generate":
            result = await agent.generate(args.text)
            print(result.text)
            if result.tripwire:
                print(
                    f"[tripwire] {result.tripwire['processorId']}: {result.tripwire['reason']}",
                    file=sys.stderr,
                )
            return 0
        stream = agent.stream(args.text)
        async for chunk in stream:
            if chunk["type"] == "text-delta":
                print(chunk["payload"]["text"], end="", flush=True)
            elif chunk["type"] in ("tripwire", "error") or chunk["type"].startswith("data-"):
                print(f"\n[{chunk['type']}] {json.dumps(chunk.get('payload', chunk.get('data')))}")
        result = await stream.result()
        print()
        return 1 if result.error else 0


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.demo import main as demo_main

    return asyncio.run(demo_main())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="procmesh", description="Run procmesh agents and scenarios.")
    sub = parser.add_subparsers(dest="command", required=True)
    scen = sub.add_parser("scenario", help="conformance scenarios")
    scen_sub = scen.add_subparsers(dest="action", required=True)
    run = scen_sub.add_parser("run", help="run a scenario and print its trace")
    run.add_argument("file")
    run.set_defaults(func=_scenario_run)
    for name in ("generate", "stream"):
        p = sub.add_parser(name, help=f"{name} with an agent from a config file")
        p.add_argument("agent")
        p.add_argument("text")
        p.add_argument("--config", required=True)
        p.set_defaults(func=lambda a: asyncio.run(_call(a)))
    demo = sub.add_parser("demo", help="start sidecars and show processors at work on the demo model")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except (OrchestratorError, ValueError, OSError, RuntimeError) as exc:
        print(f"procmesh: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
