"""The dependency rules of the layout, checked by walking every module's imports (AST, no import).

- procmesh_sidecars is written like third-party code: the public SDK only, never the orchestrator;
- the run loop (procmesh_orchestrator.run) speaks no wire: no grpc, no protobuf, no procmesh.v1;
  it stands alone: it imports neither the rooms built on it (the service, the app, the CLI, the
  processors' wire, the providers) nor the config (the app translates the config into the run's
  own types), and importing it loads no grpc and no protobuf (the faces load names lazily);
- nothing at run time imports the CLI (procmesh_orchestrator.cli);
- the orchestrator and the sidecars use only the SDK's public names (no procmesh._private module);
- inside the orchestrator, a package's ``_private`` modules are its own: no module outside the
  package imports them (what others need, the package names in its ``__init__``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def test_the_run_loop_stands_alone() -> None:
    banned = tuple(
        f"procmesh_orchestrator.{room}"
        for room in ("service", "app", "cli", "config", "cost", "providers", "tools", "sidecar_process")
    )
    assert violations(ORCHESTRATOR / "run", banned) == []


def loaded_after(statement: str) -> list[str]:
    """The wire modules a fresh interpreter holds after `statement` (a real import, no AST)."""
    code = (
        f"import sys; {statement}; "
        "print(sorted(m for m in sys.modules if m.startswith(('grpc', 'google.protobuf', 'procmesh.v1'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(ast.literal_eval(out.stdout.strip()))


def test_importing_the_run_loop_loads_no_wire() -> None:
    assert loaded_after("import procmesh_orchestrator.run") == []
    assert loaded_after("import procmesh_orchestrator.run.framework") == []
    # the SDK's face is lazy: what the loop takes from it (tracing, the log fields, parts) is wire-free
    assert loaded_after("from procmesh import RUN_ID, parts, tracing") == []


def test_the_wire_check_sees_the_wire() -> None:
    # the checks above pass on an empty list: the probe does see a module that loads grpc
    assert "grpc" in loaded_after("import procmesh_orchestrator.processors")
    assert "grpc" in loaded_after("from procmesh import ProcessorClient")


def test_runtime_code_never_imports_the_cli() -> None:
    cli = ORCHESTRATOR / "cli"
    assert violations(ORCHESTRATOR, ("procmesh_orchestrator.cli",), exempt=(cli,)) == []
    assert violations(SIDECARS, ("procmesh_orchestrator.cli",)) == []


def private_module_imports(root: Path) -> list[str]:
    """Imports of a package's underscore module (``pkg._mod``, ``pkg._mod.name``, ``from pkg
    import _mod``) by a module outside that package, for every package under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] != root.name:
                continue
            for depth in range(1, len(parts)):
                if not parts[depth].startswith("_") or parts[depth].startswith("__"):
                    continue
                place = root.parent.joinpath(*parts[: depth + 1])
                if place.with_suffix(".py").is_file() or place.is_dir():  # a module, not a name
                    owner = ".".join(parts[:depth])
                    if not (importer + ".").startswith(owner + "."):
                        found.append(f"{shown(path)}:{line} imports {module}")
                break
    return found


def test_no_package_imports_another_packages_private_modules() -> None:
    assert private_module_imports(ORCHESTRATOR) == []


def test_the_private_module_walk_sees_a_violation(tmp_path: Path) -> None:
    root = tmp_path / "procmesh_orchestrator"
    for folder in ("store", "service"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "store" / "_common.py").write_text("_label = 1\n")
    (root / "store" / "sqlite.py").write_text("from procmesh_orchestrator.store._common import _label\n")
    (root / "service" / "api.py").write_text(
        "from procmesh_orchestrator.store._common import _label\n"
        "from procmesh_orchestrator.store import _common\n"
        "import procmesh_orchestrator.store._common\n"
        "from procmesh_orchestrator.store.sqlite import _label\n"  # a private name, not a module
    )
    assert [found.split(" imports ")[1] for found in private_module_imports(root)] == [
        "procmesh_orchestrator.store._common",
        "procmesh_orchestrator.store._common._label",
        "procmesh_orchestrator.store._common",
        "procmesh_orchestrator.store._common",
    ]


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
