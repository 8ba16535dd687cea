"""procmesh-sidecar NAME [--listen ADDR]...: serve a set of built-in processors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

from procmesh import Processor, run, settings_from_args, settings_parser


def _examples(args: argparse.Namespace) -> list[Processor]:
    from procmesh_sidecars import examples

    return examples.processors()


def _error_defaults(args: argparse.Namespace) -> list[Processor]:
    from procmesh_sidecars import error_defaults

    return error_defaults.processors()


def _scripted(args: argparse.Namespace) -> list[Processor]:
    from procmesh_sidecars import scripted

    with open(args.scenario, encoding="utf-8") as f:
        return scripted.scenario_processors(json.load(f))


def _builtins(args: argparse.Namespace) -> list[Processor]:
    from procmesh_sidecars import builtins, error_defaults

    return error_defaults.processors() + builtins.processors()


def _builtin(name: str) -> Callable[[argparse.Namespace], list[Processor]]:
    def make(args: argparse.Namespace) -> list[Processor]:
        from procmesh_sidecars import builtins

        return builtins.SETS[name]()

    return make


SETS: dict[str, Callable[[argparse.Namespace], list[Processor]]] = {
    "builtins": _builtins,
    "error-defaults": _error_defaults,
    "examples": _examples,
    "scripted": _scripted,
}
# One set per built-in processor, named by its id (sidecars/builtins/__init__.py).
SETS.update(
    {
        name: _builtin(name)
        for name in (
            "background-work-signals",
            "batch-parts",
            "ensure-final-response",
            "guards",
            "regex-filter",
            "response-cache",
            "steering-reminder",
            "structured-output",
            "token-limiter",
            "tool-call-filter",
            "tool-search",
            "unicode-normalizer",
        )
    }
)


def main(argv: Sequence[str] | None = None) -> None:
    # One parser for the sets and the SDK's flags, parsed strictly: a misspelt flag is an error
    # (exit 2), never a default silently served.
    parser = settings_parser(prog="procmesh-sidecar", description="Serve built-in processors over gRPC.")
    parser.add_argument("names", nargs="+", choices=sorted(SETS), help="processor sets to serve")
    parser.add_argument("--scenario", help="scenario file (for 'scripted')")
    args = parser.parse_args(argv)
    if "scripted" in args.names and not args.scenario:
        parser.error("scripted: --scenario FILE is required")
    if args.scenario and "scripted" not in args.names:
        parser.error(
            "--scenario: only the 'scripted' set reads a scenario (serve it, or leave --scenario out)"
        )
    settings = settings_from_args(args)
    processors: list[Processor] = []
    for name in args.names:
        processors.extend(SETS[name](args))
    run(processors, settings)


if __name__ == "__main__":
    main()
