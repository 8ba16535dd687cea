"""The `procmesh` command line: demo, generate/stream, scenario run, pod, check-sidecar.

Nothing at run time imports this package (tests/unit/test_boundaries.py): the service and the
agent loop work without it.
"""

from procmesh_orchestrator.cli.main import main

__all__ = ["main"]
