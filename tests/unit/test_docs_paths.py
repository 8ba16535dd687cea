"""The docs name only repository paths that exist: paths in code spans, relative links and their
anchors, and the entries of docs/architecture.md's "Project layout" block, which must also list
every package folder of the orchestrator.

Each check reads the file system for the truth rather than a list kept by hand, so a rename that
forgets the docs fails here; `test_the_checks_catch_made_up_paths` feeds them made-up documents.
The other claims of the same pages are checked beside this module (tests/unit/test_docs_*.py).
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from tests.conftest import REPO
from tests.unit.doc_pages import DOCS, PACKAGES, Doc, _rel, missing_packages

GITHUB = "https://github.com/procmesh/procmesh/"
"""Where the package pages (sdk/README.md is PyPI's page) link into the repository: checked like a
relative link (the path after blob/main/ or tree/main/)."""

# -- repository paths ----------------------------------------------------------------------------


def _expand(token: str) -> list[str]:
    """`tests/unit/{sdk,orchestrator}/` -> both paths."""
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _exists(path: str, base: Path) -> bool:
    path = os.path.normpath(path)
    return any(base.glob(path)) if "*" in path else (base / path).exists()


def _generated(path: str) -> bool:
    """A path git ignores (bench/results.json): an output the docs may name before it is made."""
    import subprocess

    return any(  # `examples/go/build/` is ignored as a directory: ask with and without the slash
        subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", name], check=False).returncode == 0
        for name in (path, f"{path}/")
    )


def path_problems(doc: Doc) -> list[str]:
    """Every repository path in a code span that does not exist (and every relative link target)."""
    top = {p.name for p in REPO.iterdir() if not p.name.startswith(".") or p.name in (".ci", ".dockerignore")}
    here = doc.path.parent
    problems = []
    for span in doc.spans:
        words = span.split()
        for i, token in enumerate(words):
            if words[0] == "kubectl" and words[i - 1] not in ("-k", "-f", "kustomize"):
                continue  # `kubectl logs deploy/procmesh`: a resource, not a path
            token = token.strip(".,:;()'\"").rstrip("/")
            if "/" not in token or "://" in token or not re.fullmatch(r"[\w./{},*-]+", token):
                continue
            first = token.split("/")[0]
            if first in top:
                bases = [REPO, here]
            elif first in PACKAGES:
                bases = [REPO / PACKAGES[first], here]
            elif first == "..":
                bases = [here]  # e.g. `../shared/SPEC.md` lies outside the repository: checked if inside
                if not (here / token).resolve().is_relative_to(REPO):
                    continue
            else:
                continue  # relative to something the prose names (`overlays/dev/...` under deploy/k8s)
            for path in _expand(token):
                if not any(_exists(path, base) for base in bases) and not _generated(path):
                    problems.append(f"{_rel(doc.path)}: `{path}` does not exist")
    return problems + link_problems(doc)


def slugs(text: str) -> set[str]:
    """The anchors GitHub gives a markdown file's headings (fenced blocks aside): lower case, the
    punctuation dropped, spaces as hyphens, a repeated heading numbered (`-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    out = set()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(doc: Doc) -> list[str]:
    """Every relative link (and every link to this repository on GitHub) names a file that exists,
    and its `#anchor` a heading of that file (or of this one, for `#anchor` alone)."""
    problems = []
    for link in doc.links:
        target, _, anchor = link.partition("#")
        if target.startswith(GITHUB):
            found = re.match(r"(?:blob|tree)/main/(.*)", target.removeprefix(GITHUB))
            path = REPO / found[1] if found else REPO
            if not found and target.removeprefix(GITHUB).strip("/"):
                continue  # the repository's issues, its home page: not a file
        elif re.match(r"\w+:", target):
            continue  # another site
        elif not target:  # an anchor of this page
            if anchor not in slugs(doc.text):
                problems.append(f"{_rel(doc.path)}: link {link}: no heading #{anchor} in {_rel(doc.path)}")
            continue
        else:
            path = doc.path.parent / target
        if not path.exists():
            problems.append(f"{_rel(doc.path)}: link target {link} does not exist")
        elif anchor and path.suffix == ".md":
            text = doc.text if path == doc.path else path.read_text(encoding="utf-8")
            if anchor not in slugs(text):
                problems.append(f"{_rel(doc.path)}: link {link}: no heading #{anchor} in {_rel(path)}")
    return problems


def layout_problems(doc: Doc) -> list[str]:
    """A "Project layout" block (docs/architecture.md's): every entry in its first column exists.

    An indented entry (`  app.py`) lies in the last unindented directory above it; a line indented
    further continues the description of the entry before it.
    """
    problems: list[str] = []
    if "## Project layout" not in doc.text:
        return problems
    block = doc.text.split("## Project layout", 1)[1].split("```", 2)[1]
    parent = ""
    for line in block.splitlines()[1:]:
        if not line.strip() or line.startswith(" " * 4):
            continue
        column = re.split(r"\s{2,}", line.strip())[0]
        for name in column.split(", "):
            path = f"{parent}{name}" if line.startswith(" ") else name
            if not line.startswith(" ") and name.endswith("/"):
                parent = name
            if not (REPO / path).exists():
                problems.append(f"{_rel(doc.path)}: layout entry {path} does not exist")
    return problems


def layout_entries(doc: Doc) -> set[str]:
    """The repository paths a "Project layout" block names in its first column."""
    if "## Project layout" not in doc.text:
        return set()
    block = doc.text.split("## Project layout", 1)[1].split("```", 2)[1]
    entries, parent = set(), ""
    for line in block.splitlines()[1:]:
        if not line.strip() or line.startswith(" " * 4):
            continue
        for name in re.split(r"\s{2,}", line.strip())[0].split(", "):
            entries.add(f"{parent}{name}" if line.startswith(" ") else name)
            if not line.startswith(" ") and name.endswith("/"):
                parent = name
    return entries


def test_every_doc_is_checked() -> None:
    assert len(DOCS) >= 10
    assert all(path.exists() for path in DOCS)


def test_repository_paths_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in path_problems(doc)] == []


def test_the_layout_block_lists_what_exists(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in layout_problems(doc)] == []


def test_the_layout_lists_every_orchestrator_package() -> None:
    architecture = Doc.parse(REPO / "docs" / "architecture.md")
    entries = layout_entries(architecture)
    assert entries, "docs/architecture.md has the Project layout block"
    assert missing_packages(entries) == []


def test_the_checks_catch_made_up_paths() -> None:
    fake = Doc.parse(
        REPO / "docs" / "made-up.md",
        "The loop is in `orchestrator/agent.py` and `orchestrator/procmesh_orchestrator/run/loop.py`;\n"
        "see [it](architecture.md) and [that](nowhere.md).\n\n"
        "## Project layout\n\n```\norchestrator/procmesh_orchestrator/\n  errors.py   the errors\n"
        "  agent.py    gone\n              a description, not an entry\nMakefile, frob/   two\n```\n",
    )
    assert path_problems(fake) == [
        "docs/made-up.md: `orchestrator/agent.py` does not exist",
        "docs/made-up.md: link target nowhere.md does not exist",
    ]
    assert layout_problems(fake) == [
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/agent.py does not exist",
        "docs/made-up.md: layout entry frob/ does not exist",
    ]
    linked = Doc.parse(
        REPO / "docs" / "made-up.md",
        "# Title\n\n## A section\n\nSee [this](#a-section), [that](#nowhere), [it](service.md#no-such),\n"
        "[the face](https://github.com/procmesh/procmesh/blob/main/docs/nothing.md) and\n"
        "[home](https://github.com/procmesh/procmesh/issues).\n",
    )
    assert link_problems(linked) == [
        "docs/made-up.md: link #nowhere: no heading #nowhere in docs/made-up.md",
        "docs/made-up.md: link service.md#no-such: no heading #no-such in docs/service.md",
        f"docs/made-up.md: link target {GITHUB}blob/main/docs/nothing.md does not exist",
    ]
    assert missing_packages({"orchestrator/procmesh_orchestrator/run/"}) != []
    assert "orchestrator/procmesh_orchestrator/service/" in missing_packages({"x"})
