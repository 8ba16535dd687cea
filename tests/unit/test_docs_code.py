"""The docs' code runs against what exists: every python block parses and imports from our packages
only names they export (from the orchestrator, only its public face), and every code block of the
contract pages carries a snippet marker that a test reads (tests/fixtures/snippets.py).

`test_the_check_catches_made_up_imports` feeds the import check a made-up document.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO
from tests.fixtures import snippets
from tests.unit.doc_pages import Doc, _rel, made_up

OURS = ("procmesh", "procmesh_orchestrator", "procmesh_sidecars")


def import_problems(doc: Doc) -> list[str]:
    """Every python block parses, and what it imports from our packages exists; from the
    orchestrator, only the public face (`procmesh_orchestrator.__all__`)."""
    import importlib

    problems = []
    blocks = [body for lang, body in doc.blocks if lang == "python"]
    blocks += [s for s in doc.spans if re.fullmatch(r"from [\w.]+ import [\w, ]+", s)]
    for block in blocks:
        try:
            tree = compile(
                block, str(doc.path), "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
        except SyntaxError as exc:
            problems.append(f"{_rel(doc.path)}: a python block does not parse: {exc}")
            continue
        for node in ast.walk(tree):
            if (
                not isinstance(node, ast.ImportFrom)
                or not node.module
                or node.module.split(".")[0] not in OURS
            ):
                continue  # another library, or the user's own module of an earlier example
            if node.module.startswith("procmesh_orchestrator") and node.module != "procmesh_orchestrator":
                problems.append(f"{_rel(doc.path)}: import from the face, not {node.module}")
                continue
            module = importlib.import_module(node.module)
            public = getattr(module, "__all__", None) if node.module == "procmesh_orchestrator" else None
            for alias in node.names:
                if not hasattr(module, alias.name) or (public is not None and alias.name not in public):
                    problems.append(f"{_rel(doc.path)}: {node.module} does not export {alias.name}")
    return problems


def test_python_examples_import_what_exists(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in import_problems(doc)] == []


def test_the_check_catches_made_up_imports() -> None:
    fake = made_up(
        "```python\nfrom procmesh_orchestrator import App, GrpcThing\n"
        "from procmesh_orchestrator.run import Agent\n```\n",
    )
    assert import_problems(fake) == [
        "docs/made-up.md: procmesh_orchestrator does not export GrpcThing",
        "docs/made-up.md: import from the face, not procmesh_orchestrator.run",
    ]


def test_every_code_block_of_the_contract_pages_is_named_and_run_by_a_test() -> None:
    # proto/README.md and docs/other-languages.md are what an author in another language copies
    # from: each block carries a `<!-- snippet: NAME -->` marker, and a test reads it by that name
    # (tests/fixtures/snippets.py) and runs it, or parses it where it is a sketch.
    tests = "\n".join(
        p.read_text(encoding="utf-8")
        for p in (REPO / "tests").rglob("test_*.py")
        if p != Path(__file__).resolve()
    )
    problems = []
    for page in snippets.CHECKED:
        names = [b.name for b in snippets.blocks(page)]
        problems += [
            f"{page}:{b.line}: a code block without a snippet marker"
            for b in snippets.blocks(page)
            if not b.name
        ]
        problems += [
            f"{page}: snippet {n} is named twice"
            for n in sorted({n for n in names if n and names.count(n) > 1})
        ]
        problems += [f"{page}: no test reads snippet {n}" for n in names if n and f'"{n}"' not in tests]
    assert problems == []
    assert {"node-shout", "check-in-ci", "protoc-cpp"} <= {b.name for b in snippets.blocks("proto/README.md")}
