"""The README is a front door: at most 16 KB, the two commands for a fresh machine fenced at the top of
its first screen, and its Python example imports only the public face, which has what it imports.

Every other page's python blocks, links and flags are checked in test_docs_code.py,
test_docs_paths.py and test_docs_commands.py."""

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


README_LIMIT = 16 * 1024
"""Bytes: the manual lives in docs/ (issue 25: model READMEs in this field are 5-9 KB)."""

FIRST_SCREEN = 24
"""Lines a terminal or a repository page shows before any scrolling."""

TWO_COMMANDS = "```sh\nmake demo\nmake test\n```\n"


def front_door_problems(text: str) -> list[str]:
    """What keeps a README from being a front door: its size, and where the two commands stand."""
    problems = []
    if len(text.encode("utf-8")) > README_LIMIT:
        problems.append(f"README.md is {len(text.encode('utf-8'))} bytes, over {README_LIMIT}")
    at = text.find(TWO_COMMANDS)
    if at < 0:
        return [*problems, "README.md has no fenced block of exactly `make demo` and `make test`"]
    lines_before = text[:at].splitlines()
    if not lines_before or not lines_before[0].startswith("# "):
        problems.append("README.md's first line is not its title")
    if "```" in text[:at] or len(lines_before) > 4:
        problems.append("README.md's two commands are not the first thing under its title")
    after = text[at + len(TWO_COMMANDS) :].splitlines()
    block_end = len(lines_before) + TWO_COMMANDS.count("\n")
    said = [
        line for line in after[: FIRST_SCREEN - block_end] if line.startswith(("`make demo`", "`make test`"))
    ]
    if {line.split("`")[1] for line in said} != {"make demo", "make test"}:
        problems.append("README.md's first screen does not say what `make demo` and `make test` each do")
    return problems


def test_the_readme_is_a_front_door() -> None:
    assert front_door_problems((REPO / "README.md").read_text(encoding="utf-8")) == []


def test_the_front_door_check_bites() -> None:
    unfenced = "make demo\nmake test\n\nOn a fresh machine...\n# procmesh\n"
    assert front_door_problems(unfenced) == [
        "README.md has no fenced block of exactly `make demo` and `make test`"
    ]
    late = (
        "# procmesh\n\n" + "apt-get this\n" * 18 + TWO_COMMANDS + "`make demo` shows.\n`make test` tests.\n"
    )
    assert front_door_problems(late) == [
        "README.md's two commands are not the first thing under its title",
        "README.md's first screen does not say what `make demo` and `make test` each do",  # pushed off it
    ]
    silent = "# procmesh\n\n" + TWO_COMMANDS + "\nMore.\n"
    assert front_door_problems(silent) == [
        "README.md's first screen does not say what `make demo` and `make test` each do"
    ]
    big = "# procmesh\n\n" + TWO_COMMANDS + "`make demo` shows.\n`make test` tests.\n" + "x" * README_LIMIT
    assert front_door_problems(big) == [f"README.md is {len(big)} bytes, over {README_LIMIT}"]
