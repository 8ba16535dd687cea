"""The docs name only repository paths that exist: paths in code spans (from the repository's root,
or from a package's, as `run/loop.py`), relative links and their anchors, the test files they cite
by name, and the entries of docs/architecture.md's "Project layout" block and the files its
descriptions name; the block must also list every package folder and module of the orchestrator,
and its Makefile line every target of the Makefile.

Each check reads the file system for the truth rather than a list kept by hand, so a rename that
forgets the docs fails here; `test_the_checks_catch_made_up_paths` feeds them made-up documents.
The other claims of the same pages are checked beside this module (tests/unit/test_docs_*.py).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.unit.doc_pages import DOCS, ORCHESTRATOR, PACKAGES, Doc, _rel, made_up, missing_packages

GITHUB = "https://github.com/procmesh/procmesh/"
"""Where the package pages (sdk/README.md is PyPI's page) link into the repository: checked like a
relative link (the path after blob/main/ or tree/main/)."""

# -- repository paths ----------------------------------------------------------------------------


def _expand(token: str) -> list[str]:
    """`tests/unit/{sdk,orchestrator}/` -> both paths."""
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


PACKAGE_ROOTS = [REPO / folder / package for package, folder in PACKAGES.items()] + [REPO / "sdk" / "node"]
"""Where a path that starts inside a package (`run/loop.py`, `lib/hooks.js`) is looked for."""


def package_folders() -> set[str]:
    """The folders of the packages' roots (`run`, `service`, `lib`), top-level names aside."""
    folders = {p.name for root in PACKAGE_ROOTS for p in root.iterdir() if p.is_dir()}
    return {f for f in folders if not f.startswith((".", "__")) and f != "node_modules"} - {
        p.name for p in REPO.iterdir()
    }


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
            elif first in package_folders() and re.search(r"\.[a-z]+$|/$", words[i].strip(".,:;()'\"")):
                # `run/loop.py`, `service/grpc/`: inside a package (a file or a folder, so that the
                # processor reference `builtins/moderation` and the MCP method `tools/call` are not)
                bases = [*PACKAGE_ROOTS, here]
            else:
                continue  # relative to something the prose names (`overlays/dev/...` under deploy/k8s)
            for path in _expand(token):
                if not any(_exists(path, base) for base in bases) and not _generated(path):
                    problems.append(f"{_rel(doc.path)}: `{path}` does not exist")
    return problems + link_problems(doc)


@functools.cache
def cited_test_files() -> frozenset[str]:
    found = [*(REPO / "tests").rglob("test_*.py"), *(REPO / "sdk" / "node" / "test").rglob("*.test.*js")]
    return frozenset(p.name for p in found)


def evidence_problems(doc: Doc) -> list[str]:
    """Every test module a doc cites by its name alone (`test_stream.py`, "pinned by ...") is one
    under tests/, every Node test file (`server.test.js`) one of the Node SDK's, and every
    `tests/...py::test_name` a test that module defines."""
    tests = cited_test_files()
    named = re.findall(r"(?<![\w/.-])(test_\w+\.py|[\w-]+\.test\.m?js)\b", doc.text)
    problems = [f"{_rel(doc.path)}: no test file {name}" for name in sorted(set(named)) if name not in tests]
    for path, test in re.findall(r"\b(tests/[\w/.-]+\.py)::(?:\w+::)*(\w+)", doc.text):
        source = (REPO / path).read_text(encoding="utf-8") if (REPO / path).exists() else ""
        if not re.search(rf"^\s*(?:async def|def|class) {test}\b", source, flags=re.M):
            problems.append(f"{_rel(doc.path)}: {path} has no {test}")
    return problems


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


def _layout(doc: Doc) -> list[tuple[list[str], str]]:
    """A "Project layout" block's (docs/architecture.md's) lines: the entries in each line's first
    column and its description. An indented entry (`  app.py`) lies in the last unindented
    directory above it; a line indented further continues the description of the entry before it."""
    if "## Project layout" not in doc.text:
        return []
    block = doc.text.split("## Project layout", 1)[1].split("```", 2)[1]
    lines: list[tuple[list[str], str]] = []
    parent = ""
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        if line.startswith(" " * 4):
            if lines:
                lines[-1] = (lines[-1][0], f"{lines[-1][1]} {line.strip()}")
            continue
        column = re.split(r"\s{2,}", line.strip())[0]
        entries = []
        for name in column.split(", "):
            entries.append(f"{parent}{name}" if line.startswith(" ") else name)
            if not line.startswith(" ") and name.endswith("/"):
                parent = name
        lines.append((entries, line.strip()[len(column) :]))
    return lines


def layout_problems(doc: Doc) -> list[str]:
    """Every entry of a "Project layout" block exists, and so does every file (`loop.py`) or folder
    (`mcp/`) a folder's description names, somewhere under that folder, and every class its
    description puts in a file (`lanes.py (ProcessorHandle, ...)`) is in that file."""
    problems = []
    for entries, description in _layout(doc):
        problems += [
            f"{_rel(doc.path)}: layout entry {e} does not exist" for e in entries if not (REPO / e).exists()
        ]
        folder = REPO / entries[0]
        if len(entries) == 1 and folder.suffix == ".py" and folder.is_file():
            # `run/agent.py   Agent: ...`: a module's line names classes of that module
            source = folder.read_text(encoding="utf-8")
            problems += [
                f"{_rel(doc.path)}: layout entry {entries[0]}: {name} is not in it"
                for name in re.findall(r"\b([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)\b", description)
                if not re.search(rf"\b{name}\b", source)
            ]
        if len(entries) > 1 or not folder.is_dir():
            continue
        files = re.findall(r"(?<![\w./-])([\w/]+\.(?:py|js|proto))\b", description)
        folders = re.findall(r"(?<![\w./-])(\w+/)(?=[\s,;)]|$)", description)
        problems += [
            f"{_rel(doc.path)}: layout entry {entries[0]} names {name}, not under it"
            for name in [*files, *folders]
            if not (folder / name).exists() and not any(folder.rglob(name.rstrip("/")))
        ]
        # `lanes.py (ProcessorHandle, workflow steps)`: the class is in that module
        for file, inside in re.findall(r"([\w/]+\.py) \(([^()]*(?:\([^()]*\)[^()]*)*)\)", description):
            source = "\n".join(p.read_text(encoding="utf-8") for p in folder.rglob(file.rsplit("/", 1)[-1]))
            problems += [
                f"{_rel(doc.path)}: layout entry {entries[0]}: {name} is not in {file}"
                for name in re.findall(r"\b([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)\b", inside)
                if source and not re.search(rf"\b{name}\b", source)
            ]
    return problems


def layout_entries(doc: Doc) -> set[str]:
    """The repository paths a "Project layout" block names in its first column."""
    return {entry for entries, _ in _layout(doc) for entry in entries}


def missing_modules(doc: Doc) -> list[str]:
    """Every module of the orchestrator (a ``.py`` file under procmesh_orchestrator/, package
    ``__init__.py`` files aside) that is not an entry of the "Project layout" block."""
    entries = layout_entries(doc)
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--", f"{ORCHESTRATOR}*.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()  # what the tree holds, not another checkout's files in progress
    return [p for p in sorted(tracked) if not p.endswith("/__init__.py") and p not in entries]


def makefile_problems(doc: Doc) -> list[str]:
    """The layout's `Makefile` line names the Makefile's targets, every one and no other (its
    description is the list of them: `install, deps, test, ...`)."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))
    problems = []
    for entries, description in _layout(doc):
        if "Makefile" not in entries:
            continue
        named = set(re.findall(r"[a-z][\w-]*", description))
        problems += [
            f"{_rel(doc.path)}: the layout's Makefile line lacks target {t}" for t in sorted(targets - named)
        ]
        problems += [
            f"{_rel(doc.path)}: the layout's Makefile line names {t}, no target"
            for t in sorted(named - targets)
        ]
    return problems


def test_every_doc_is_checked() -> None:
    assert len(DOCS) >= 10
    assert all(path.exists() for path in DOCS)


def test_repository_paths_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in path_problems(doc)] == []


def test_files_cited_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in evidence_problems(doc)] == []


def test_the_layout_block_lists_what_exists(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in layout_problems(doc)] == []


def test_the_layout_lists_every_orchestrator_package() -> None:
    architecture = Doc.parse(REPO / "docs" / "architecture.md")
    entries = layout_entries(architecture)
    assert entries, "docs/architecture.md has the Project layout block"
    assert missing_packages(entries) == []


def test_the_layout_lists_every_orchestrator_module() -> None:
    assert missing_modules(Doc.parse(REPO / "docs" / "architecture.md")) == []


def test_the_layout_names_every_make_target() -> None:
    architecture = Doc.parse(REPO / "docs" / "architecture.md")
    assert any("Makefile" in entries for entries, _ in _layout(architecture))
    assert makefile_problems(architecture) == []


def test_the_makefile_check_catches_a_missing_and_a_made_up_target() -> None:
    real = Doc.parse(REPO / "docs" / "architecture.md").text
    assert real.count("conformance, demo, bench, clean") == 1
    fake = made_up(real.replace("conformance, demo, bench, clean", "conformance, showcase, clean"))
    assert makefile_problems(fake) == [
        "docs/made-up.md: the layout's Makefile line lacks target bench",
        "docs/made-up.md: the layout's Makefile line lacks target demo",
        "docs/made-up.md: the layout's Makefile line names showcase, no target",
    ]


def test_the_module_check_catches_a_missing_module_and_a_made_up_one() -> None:
    real = Doc.parse(REPO / "docs" / "architecture.md").text
    fake = made_up(real.replace("  run/loop.py ", "  run/loops.py ", 1))
    assert missing_modules(fake) == [f"{ORCHESTRATOR}run/loop.py"]
    assert layout_problems(fake) == [
        f"docs/made-up.md: layout entry {ORCHESTRATOR}run/loops.py does not exist",
    ]
    wrong = made_up(
        real.replace("  run/agent.py                       Agent:", "  run/agent.py  RunCore:", 1)
    )
    assert layout_problems(wrong) == [
        f"docs/made-up.md: layout entry {ORCHESTRATOR}run/agent.py: RunCore is not in it",
    ]


def test_the_checks_catch_made_up_paths() -> None:
    fake = made_up(
        "The loop is in `orchestrator/agent.py` and `orchestrator/procmesh_orchestrator/run/loop.py`;\n"
        "see [it](architecture.md) and [that](nowhere.md). `run/loop.py` and `run/looping.py`,\n"
        "`service/grpc/` and `service/rest/`, `lib/hooks.js`; `builtins/moderation` is a reference.\n\n"
        "## Project layout\n\n```\norchestrator/procmesh_orchestrator/\n  errors.py   the errors\n"
        "  agent.py    gone\n              a description, not an entry\n"
        "  run/        loop.py (SessionClock), agent.py (`Agent`), mcp/\n              loops.py\n"
        "Makefile, frob/   two\n```\n",
    )
    assert path_problems(fake) == [
        "docs/made-up.md: `orchestrator/agent.py` does not exist",
        "docs/made-up.md: `run/looping.py` does not exist",
        "docs/made-up.md: `service/rest` does not exist",
        "docs/made-up.md: link target nowhere.md does not exist",
    ]
    assert layout_problems(fake) == [
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/agent.py does not exist",
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/run/ names loops.py, not under it",
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/run/ names mcp/, not under it",
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/run/: "
        "SessionClock is not in loop.py",
        "docs/made-up.md: layout entry frob/ does not exist",
    ]
    cited = made_up(
        "Pinned by test_boundaries.py, `test_made_up.py` and server.test.js, not gone.test.js;\n"
        "`tests/unit/test_docs_paths.py::test_files_cited_exist`, `tests/unit/test_readme.py::test_gone`.\n",
    )
    assert evidence_problems(cited) == [
        "docs/made-up.md: no test file gone.test.js",
        "docs/made-up.md: no test file test_made_up.py",
        "docs/made-up.md: tests/unit/test_readme.py has no test_gone",
    ]
    linked = made_up(
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
