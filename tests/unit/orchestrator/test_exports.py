"""The public face of `procmesh_orchestrator` is pinned, like the SDK's (tests/unit/sdk/test_exports.py)."""

from __future__ import annotations

import inspect

import procmesh_orchestrator
from tests.unit.sdk.test_exports import isort_key

EXPECTED_ALL = [
    "Agent",
    "AgentSpec",
    "App",
    "CallOptions",
    "Config",
    "GrpcHookCaller",
    "Lanes",
    "ModelProvider",
    "ModelRequest",
    "OrchestratorMetrics",
    "OrchestratorSettings",
    "ProcessorHandle",
    "RunInfo",
    "RunResult",
    "RunStream",
    "ScriptedModel",
    "SidecarProcess",
    "errors",
    "hook_names",
    "load_config",
    "parse_config",
]


def test_all_is_pinned_and_sorted() -> None:
    assert procmesh_orchestrator.__all__ == EXPECTED_ALL
    assert sorted(EXPECTED_ALL, key=isort_key) == EXPECTED_ALL


def test_every_export_exists_and_has_a_docstring() -> None:
    for name in procmesh_orchestrator.__all__:
        value = getattr(procmesh_orchestrator, name)
        assert inspect.getdoc(value), f"{name} has no docstring"


def test_the_face_does_not_pull_in_the_cli_or_the_service() -> None:
    # Importing the package must stay light: `procmesh scenario run` starts once per scenario.
    import subprocess
    import sys

    code = (
        "import sys, procmesh_orchestrator; "
        "print(sorted(m for m in sys.modules if m.startswith(('procmesh_orchestrator.cli', "
        "'procmesh_orchestrator.service', 'starlette', 'uvicorn'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
