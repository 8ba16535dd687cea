"""The README's Python example imports only the public face, and what it imports exists."""

from __future__ import annotations

import ast
import importlib
import re

from tests.conftest import REPO

OURS = ("procmesh", "procmesh_orchestrator", "procmesh_sidecars")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_python_examples_import_public_names_that_exist() -> None:
    blocks = python_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks
    for block in blocks:
        tree = ast.parse(block)  # every example at least parses
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                if top not in OURS:
                    continue  # the user's own module of an earlier example
                if top == "procmesh_orchestrator":
                    assert node.module == "procmesh_orchestrator", f"import from the face, not {node.module}"
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
                    if top == "procmesh_orchestrator":
                        assert alias.name in module.__all__, alias.name
