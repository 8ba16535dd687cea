"""The `procmesh` command: demo, generate, stream, memory, runs, replay, scenario run, check-sidecar, pod."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from procmesh import __version__, configure_logging
from procmesh.environment import check_environment
from procmesh_orchestrator.cli import memory, replay, runs
from procmesh_orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from procmesh_orchestrator.run import RunResult


def _scenario_run(args: argparse.Namespace) -> int:
    from procmesh_orchestrator.cli.scenario import load, run_scenario

    data = load(args.file)
    trace = asyncio.run(
        run_scenario(
            data, args.file, sidecar_runtime=args.sidecar_runtime, speculate=args.speculate, fuse=args.fuse
        )
    )
    json.dump(trace, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def _config_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``--config``, else ``PROCMESH_CONFIG_FILE``: the orchestrator's rule, so one environment serves both
    (``PROCMESH_CONFIG__<KEY>`` overrides apply to either, in `load_config`)."""
    if "PROCMESH_CONFIG" in os.environ:
        # Renamed: silently ignoring the old name would run the wrong agents.
        parser.error(
            "PROCMESH_CONFIG was renamed PROCMESH_CONFIG_FILE (PROCMESH_CONFIG__<KEY> variables override "
            "keys of the file)"
        )
    path = args.config or os.environ.get("PROCMESH_CONFIG_FILE")
    if not path:
        parser.error(f"{args.command}: --config FILE (or PROCMESH_CONFIG_FILE) is required")
    return path


def _check_environment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A ``PROCMESH_*`` variable no procmesh component reads (nor the command's config names, a
    ``dsnEnv`` say) is a usage error naming it: a typo must not run on defaults."""
    check = check_environment("cli", os.environ)
    path = getattr(args, "config", None) or os.environ.get("PROCMESH_CONFIG_FILE")
    if check.unknown and path:
        from procmesh_orchestrator.app import secret_variables
        from procmesh_orchestrator.config import load_config

        try:
            named = secret_variables(load_config(path))
        except (OrchestratorError, OSError):
            named = set()  # the command itself says what is wrong with its config
        check = check_environment("cli", os.environ, also=named)
    if (error := check.error()) is not None:
        parser.error(error)


EXIT_FAILED = 1
"""The run failed (its error is on stderr)."""
EXIT_TRIPWIRE = 3
"""A processor tripped the run: a refusal, not a failure (2 is a usage or configuration error)."""


def _context_entry(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--context``: VALUE as JSON when it parses, else the string itself."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def _outcome(result: RunResult) -> int:
    """Print what `generate` and `stream` both report on stderr, the same way, and the exit code:
    0 success, 1 the run failed, 3 a tripwire."""
    if result.tripwire:
        print(f"[tripwire] {result.tripwire['processorId']}: {result.tripwire['reason']}", file=sys.stderr)
        return EXIT_TRIPWIRE
    if result.error:
        print(f"[error] {result.error}", file=sys.stderr)
        return EXIT_FAILED
    return 0


async def _call(args: argparse.Namespace) -> int:
    from procmesh_orchestrator import CallOptions
    from procmesh_orchestrator.app import App
    from procmesh_orchestrator.config import load_config
    from procmesh_orchestrator.service.api.results import dumps, result_json, wire_chunk

    # The command line is trusted as the Python API is: it names the thread and resource itself.
    options = CallOptions(
        thread_id=args.thread or "", resource_id=args.resource or "", request_context=dict(args.context)
    )
    async with App(load_config(args.config)) as app:
        agent = app.agent(args.agent)
        if args.thread and agent.spec.memory is None:  # the run goes on, as over the APIs (a warning)
            print(
                f"procmesh: warning: agent {args.agent!r} has no memory: --thread is not loaded or "
                "saved (nothing of this turn is kept)",
                file=sys.stderr,
                flush=True,
            )
        if args.command == "generate":
            try:
                result = await agent.generate(args.text, options)
            except OrchestratorError as exc:
                if exc.result is None:  # refused before a run started (its request context)
                    raise
                result = exc.result  # a failed run: reported as stream reports one
            if args.json:  # the body POST /api/agents/{id}/generate answers
                print(dumps(result_json(result)))
            else:
                print(result.text)
            return _outcome(result)
        stream = agent.stream(args.text, options)
        run_id = ""
        async for chunk in stream:
            if args.json:  # NDJSON: the chunks the HTTP stream sends as server-sent events
                if chunk["type"] == "start":
                    run_id = str((chunk.get("payload") or {}).get("runId", ""))
                print(dumps(wire_chunk(chunk, run_id)), flush=True)
            elif chunk["type"] == "text-delta":
                print(chunk["payload"]["text"], end="", flush=True)
            elif chunk["type"].startswith("data-"):
                print(f"\n[{chunk['type']}] {json.dumps(chunk.get('data'))}", flush=True)
        result = await stream.result()
        if not args.json:
            print()
        return _outcome(result)


def _pod(args: argparse.Namespace) -> int:
    from procmesh_orchestrator.cli.pod.command import render_command, run_command

    if args.action == "render":
        return render_command(args.path)
    return run_command(args.path, deployment=args.deployment, free_ports=args.free_ports, keep=args.keep)


def _demo(args: argparse.Namespace) -> int:
    from procmesh_orchestrator.cli.demo import main as demo_main

    return asyncio.run(demo_main())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="procmesh", description="Run procmesh agents and scenarios.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", help="logging level (default WARNING)")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text (default) or json: one JSON object per line (or PROCMESH_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    scen = sub.add_parser("scenario", help="conformance scenarios")
    scen_sub = scen.add_subparsers(dest="action", required=True)
    run = scen_sub.add_parser("run", help="run a scenario and print its trace")
    run.add_argument("file")
    run.add_argument(
        "--sidecar-runtime",
        choices=["python", "node"],
        default="python",
        help="SDK serving the scripted processors: python (procmesh-sidecar) or node (sdk/node)",
    )
    run.add_argument(
        "--speculate",
        action="store_true",
        help="every scripted processor declares itself speculative (the trace must not change)",
    )
    run.add_argument(
        "--fuse",
        action="store_true",
        help="fuse the processors the scripted sidecar serves into one request (the trace must not change)",
    )
    run.set_defaults(func=_scenario_run)
    for name in ("generate", "stream"):
        p = sub.add_parser(name, help=f"{name} with an agent from a config file")
        p.add_argument("agent", help="the agent's id in the config")
        p.add_argument("text", help="the user message")
        p.add_argument("--config", help="YAML configuration file (default: PROCMESH_CONFIG_FILE)")
        p.add_argument(
            "--json",
            action="store_true",
            help="print the result as the HTTP API's JSON"
            if name == "generate"
            else "print every chunk as one JSON object per line (NDJSON)",
        )
        p.add_argument("--thread", help="the memory thread: load its history and save this turn to it")
        p.add_argument("--resource", help="who the call is for (a user, an org); the thread belongs to it")
        p.add_argument(
            "--context",
            action="append",
            default=[],
            type=_context_entry,
            metavar="KEY=VALUE",
            help="a request-context entry (repeatable); VALUE is parsed as JSON when it is valid JSON "
            '(7, true, {"a": 1}, "7"), else taken as a string',
        )
        p.set_defaults(func=lambda a: asyncio.run(_call(a)))
    memory.add_parser(sub).set_defaults(func=lambda a: asyncio.run(memory.run(a)))
    runs.add_parser(sub).set_defaults(func=lambda a: asyncio.run(runs.run(a)))
    replay.add_parser(sub).set_defaults(func=lambda a: asyncio.run(replay.run(a)))
    # Listed for `procmesh --help` only: main() hands `check-sidecar ...` to the SDK's checker first.
    sub.add_parser(
        "check-sidecar",
        add_help=False,
        help="check that a sidecar (any language) keeps the procmesh.v1 contract (procmesh-check-sidecar)",
    )
    pod = sub.add_parser(
        "pod", help="the Kubernetes pod (deploy/k8s): render it, or run it as local processes"
    )
    pod_sub = pod.add_subparsers(dest="action", required=True)
    pod_run = pod_sub.add_parser(
        "run", help="run the pod's containers as local processes, in the kubelet's order"
    )
    pod_render = pod_sub.add_parser("render", help="print the rendered manifests (runs kubectl kustomize)")
    for p in (pod_run, pod_render):
        p.add_argument(
            "path", help="a kustomization directory (deploy/k8s/overlays/dev) or a rendered YAML file"
        )
    pod_run.add_argument("--deployment", help="the Deployment to run (default: the only one)")
    pod_run.add_argument(
        "--free-ports", action="store_true", help="map every container port to a free local port"
    )
    pod_run.add_argument("--keep", action="store_true", help="keep the pod's temporary directory")
    pod.set_defaults(func=_pod)
    demo = sub.add_parser("demo", help="start sidecars and show processors at work on the demo model")
    demo.set_defaults(func=_demo)
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["check-sidecar"]:
        # An alias of the SDK's procmesh-check-sidecar, which parses its own arguments (and --help).
        from procmesh.check import check_sidecar

        sys.exit(check_sidecar(words[1:], prog="procmesh check-sidecar"))
    args = parser.parse_args(argv)
    keys = [key for key, _ in getattr(args, "context", ())]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        # dict() would keep the last value without a word
        parser.error(f"--context: {', '.join(map(repr, twice))} given more than once (give each key once)")
    if args.command in ("generate", "stream", "memory", "runs"):
        args.config = _config_path(parser, args)
    _check_environment(parser, args)
    try:
        configure_logging(args.log_level or "WARNING", args.log_format)
    except ValueError as exc:  # PROCMESH_LOG_FORMAT
        parser.error(str(exc))
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, where a reader that went away is handled, not at the interpreter's exit
    except BrokenPipeError:
        # whoever read the output stopped reading (`procmesh runs decisions --json | head`): no
        # traceback; stdout goes to /dev/null so nothing tries to write to the pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141  # what a shell reports for a command a closed pipe ended (128 + SIGPIPE)
    except OrchestratorError as exc:  # every expected failure is in the tree; anything else is a bug
        print(f"procmesh: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
