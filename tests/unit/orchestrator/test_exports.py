"""The public face of `procmesh_orchestrator` is pinned, like the SDK's (tests/unit/sdk/test_exports.py)."""

from __future__ import annotations

import inspect

import procmesh_orchestrator
from tests.unit.sdk.test_exports import isort_key, lazy_face_problems

EXPECTED_ALL = [
    "Agent",
    "AgentSpec",
    "App",
    "BackgroundOptions",
    "BackgroundTool",
    "CallOptions",
    "ClientTool",
    "Config",
    "CostGuardProcessor",
    "FunctionTool",
    "FunctionToolContext",
    "HasToolCall",
    "HistoryBudget",
    "Lanes",
    "MemoryCallOptions",
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
    "StepContext",
    "StepCountIs",
    "StepOverride",
    "StepRule",
    "StopCondition",
    "StructuredOutput",
    "TokenCostControl",
    "errors",
    "load_config",
    "parse_config",
]


def test_all_is_pinned_and_sorted() -> None:
    assert procmesh_orchestrator.__all__ == EXPECTED_ALL
    assert sorted(EXPECTED_ALL, key=isort_key) == EXPECTED_ALL


def test_the_face_hides_the_wire() -> None:
    # the gRPC caller and the hook table are the processors room's; the face is what users build
    for name in ("GrpcHookCaller", "hook_names"):
        assert not hasattr(procmesh_orchestrator, name)


def test_the_lazy_face_and_its_type_checking_imports_agree() -> None:
    assert lazy_face_problems(procmesh_orchestrator) == []


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
