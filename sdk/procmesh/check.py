"""``procmesh-check-sidecar``: check that a sidecar, in any language, keeps the procmesh.v1 contract.

Installed with the SDK (``pip install procmesh-sdk`` pulls nothing of the orchestrator), so an
author in another language can run it in CI against their sidecar::

    procmesh-check-sidecar unix:///tmp/my.sock --timeout 3 --options 'my-guard={"words": ["x"]}'

The orchestrator's ``procmesh check-sidecar`` is an alias that calls `check_sidecar`. The flags
live in `procmesh._check.cli`.
"""

from __future__ import annotations

from collections.abc import Sequence

from procmesh._check.cli import main

__all__ = ["check_sidecar"]


def check_sidecar(argv: Sequence[str] | None = None, *, prog: str = "procmesh-check-sidecar") -> int:
    """Run every check against the sidecar named on the command line and print the report.

    Args:
        argv: The arguments after the program name (``sys.argv[1:]`` when None).
        prog: The program name shown in usage and errors (the orchestrator's alias passes its own).

    Returns:
        0 when no check failed (skipped checks do not count), 1 otherwise. Bad arguments
        (``--options`` that is not a JSON object, ...) exit with status 2, as argparse does.
    """
    return main(argv, prog)
