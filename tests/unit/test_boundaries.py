"""The dependency rules of the layout, checked by walking every module's imports (AST, no import).

- procmesh_sidecars is written like third-party code: the public SDK only, never the orchestrator;
- the run loop (procmesh_orchestrator.run) speaks no wire: no grpc, no protobuf, no procmesh.v1;
- nothing at run time imports the CLI (procmesh_orchestrator.cli);
- the orchestrator and the sidecars use only the SDK's public names (no procmesh._private module).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

ORCHESTRATOR = REPO / "orchestrator" / "procmesh_orchestrator"
SIDECARS = REPO / "sidecars" / "procmesh_sidecars"


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in a file, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: use absolute imports")
            module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # `from procmesh import _x` reaches a private module too
                yield node.lineno, f"{module}.{alias.name}"


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def violations(folder: Path, banned: tuple[str, ...], *, exempt: tuple[Path, ...] = ()) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        if any(path.is_relative_to(e) for e in exempt):
            continue
        for line, module in imports(path):
            if any(module == b or module.startswith(b + ".") for b in banned):
                found.append(f"{shown(path)}:{line} imports {module}")
    return found


def private_sdk_imports(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] == "procmesh" and any(p.startswith("_") and p != "__version__" for p in parts[1:]):
                found.append(f"{shown(path)}:{line} imports {module}")
    return found


def test_the_sidecars_never_import_the_orchestrator() -> None:
    assert violations(SIDECARS, ("procmesh_orchestrator",)) == []


def test_the_run_loop_imports_no_grpc_and_no_protobuf() -> None:
    run = ORCHESTRATOR / "run"
    assert run.is_dir(), "the run loop lives in procmesh_orchestrator/run"
    banned = (
        "grpc",
        "google.protobuf",
        "procmesh.v1",
        "procmesh.convert",
        "procmesh_orchestrator.processors",
    )
    assert violations(run, banned) == []


def test_runtime_code_never_imports_the_cli() -> None:
    cli = ORCHESTRATOR / "cli"
    assert violations(ORCHESTRATOR, ("procmesh_orchestrator.cli",), exempt=(cli,)) == []
    assert violations(SIDECARS, ("procmesh_orchestrator.cli",)) == []


@pytest.mark.parametrize("folder", [ORCHESTRATOR, SIDECARS], ids=["orchestrator", "sidecars"])
def test_only_public_sdk_names_are_imported(folder: Path) -> None:
    assert private_sdk_imports(folder) == []


def test_the_walk_sees_a_violation(tmp_path: Path) -> None:
    # The checks above pass on an empty list: prove the walker reports what it should.
    bad = tmp_path / "bad.py"
    bad.write_text("import grpc\nfrom procmesh import _server\nfrom procmesh.v1 import types_pb2\n")
    assert [m for _, m in imports(bad)] == [
        "grpc",
        "procmesh",
        "procmesh._server",
        "procmesh.v1",
        "procmesh.v1.types_pb2",
    ]
    assert len(violations(tmp_path, ("grpc", "procmesh.v1"))) == 3
    assert len(private_sdk_imports(tmp_path)) == 1
