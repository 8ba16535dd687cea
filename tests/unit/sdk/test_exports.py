"""The public API of `procmesh` is pinned: adding or removing a name is a deliberate change here."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import procmesh

EXPECTED_ALL = [
    "HOOK_NAMES",
    "RUN_ID",
    "SERVICE_NAME",
    "TRACE_ID",
    "JsonFormatter",
    "JudgeSection",
    "MessageList",
    "ModelError",
    "Processor",
    "ProcessorClient",
    "ProcessorServer",
    "ProcessorSettings",
    "Tool",
    "ToolContext",
    "TripWire",
    "Writer",
    "__version__",
    "channel_credentials",
    "check",
    "configure_logging",
    "convert",
    "errors",
    "hooks",
    "parts",
    "run",
    "serve",
    "server_credentials",
    "settings_from_args",
    "settings_parser",
    "translate_rpc_error",
]


def isort_key(name: str) -> tuple[int, list[int | str]]:
    """ruff RUF022's isort-style order: SCREAMING_CASE, then CamelCase, then the rest; natural sort."""
    if len(name) > 1 and name.isupper():
        group = 0
    elif name[:1].isupper():
        group = 1
    else:
        group = 2
    natural: list[int | str] = [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
    return group, natural


def test_all_is_pinned() -> None:
    assert procmesh.__all__ == EXPECTED_ALL


def test_all_is_sorted_as_written() -> None:
    assert procmesh.__all__ == sorted(procmesh.__all__, key=isort_key)
    assert len(set(procmesh.__all__)) == len(procmesh.__all__)


def test_isort_key_orders_by_case_group() -> None:
    # Guards the sort test itself: plain sorted() would put "MessageList" before "SERVICE_NAME".
    assert sorted(["run", "Processor", "SERVICE_NAME", "__version__"], key=isort_key) == [
        "SERVICE_NAME",
        "Processor",
        "__version__",
        "run",
    ]


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_export_exists(name: str) -> None:
    assert hasattr(procmesh, name)


def lazy_face_problems(face: ModuleType) -> list[str]:
    """A lazy face (PEP 562) says twice where each name lives: `_EXPORTS` for the interpreter, the
    `TYPE_CHECKING` imports for type checkers. What differs between them and `__all__`."""
    assert face.__file__ is not None
    tree = ast.parse(Path(face.__file__).read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.unparse(imp)
                assert imp.module, ast.unparse(imp)
                typed.update({alias.name: imp.module for alias in imp.names})
    exports: dict[str, str] = face._EXPORTS
    problems = [
        f"{n}: TYPE_CHECKING says {typed.get(n)}, _EXPORTS {exports.get(n)}"
        for n in sorted({*typed, *exports})
        if typed.get(n) != exports.get(n)
    ]
    if sorted(exports) != sorted(face.__all__):
        problems.append(f"_EXPORTS and __all__ differ: {sorted(set(exports) ^ set(face.__all__))}")
    return problems


def test_the_lazy_face_and_its_type_checking_imports_agree() -> None:
    assert lazy_face_problems(procmesh) == []


def test_the_lazy_face_check_sees_a_difference(tmp_path: Path) -> None:
    face = tmp_path / "face.py"
    face.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import X, Y\n"
        "__all__ = ['X', 'Y']\n_EXPORTS = {'X': 'a', 'Y': 'b'}\n"
    )
    module = ModuleType("face")
    module.__file__ = str(face)
    exec(compile(face.read_text(), str(face), "exec"), module.__dict__)
    assert lazy_face_problems(module) == ["Y: TYPE_CHECKING says a, _EXPORTS b"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'GrpcThing'"):
        procmesh.GrpcThing  # noqa: B018


def _documentable(module: ModuleType) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            out.append((f"{module.__name__}.{name}", obj))
    return out


# The exported modules' own __all__ is public API too (procmesh.convert.to_value, ...).
DOCUMENTABLE = [
    *_documentable(procmesh),
    *_documentable(procmesh.check),
    *_documentable(procmesh.convert),
    *_documentable(procmesh.errors),
]


@pytest.mark.parametrize(("qualname", "obj"), DOCUMENTABLE, ids=[q for q, _ in DOCUMENTABLE])
def test_every_export_has_a_docstring(qualname: str, obj: object) -> None:
    # obj.__doc__, not inspect.getdoc(): getdoc inherits a base class's docstring.
    doc = obj.__doc__
    assert isinstance(doc, str), f"{qualname} has no docstring"
    assert doc.strip(), f"{qualname} has an empty docstring"


def test_documentable_covers_the_classes_and_functions() -> None:
    names = {q for q, _ in DOCUMENTABLE}
    assert {"procmesh.Processor", "procmesh.run", "procmesh.convert", "procmesh.errors"} <= names
    assert "procmesh.__version__" not in names
