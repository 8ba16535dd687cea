"""``procmesh-check-sidecar``: check that a sidecar, in any language, keeps the procmesh.v1 contract.

Installed with the SDK (``pip install procmesh-sdk`` pulls nothing of the orchestrator), so an
author in another language can run it in CI against their sidecar::

    procmesh-check-sidecar unix:///tmp/my.sock --timeout 3

The orchestrator's ``procmesh check-sidecar`` is an alias that calls `check_sidecar`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from procmesh._check.checker import check

__all__ = ["check_sidecar"]


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check that a sidecar (any language) keeps the procmesh.v1 contract; "
        "exit 1 if a check fails.",
    )
    parser.add_argument("address", help="host:port or unix:///path.sock")
    parser.add_argument("--processor", help="check only this processor (default: every hosted one)")
    parser.add_argument("--options", help="options (a JSON object) sent to the processors")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds to wait for SERVING (default 10)")
    return parser


def check_sidecar(argv: Sequence[str] | None = None, *, prog: str = "procmesh-check-sidecar") -> int:
    """Run every check against the sidecar named on the command line and print the report.

    Args:
        argv: The arguments after the program name (``sys.argv[1:]`` when None).
        prog: The program name shown in usage and errors (the orchestrator's alias passes its own).

    Returns:
        0 when no check failed (skipped checks do not count), 1 otherwise. Bad arguments
        (``--options`` that is not a JSON object, ...) exit with status 2, as argparse does.
    """
    parser = _parser(prog)
    args = parser.parse_args(argv)
    options: dict[str, Any] | None = None
    if args.options:
        try:
            value = json.loads(args.options)
        except ValueError as exc:
            parser.error(f"--options is not JSON: {exc}")
        if not isinstance(value, dict):
            parser.error("--options must be a JSON object")
        options = value
    report = asyncio.run(
        check(args.address, processor=args.processor, options=options, timeout=args.timeout, wait=args.wait)
    )
    return 1 if report.count("FAIL") else 0
