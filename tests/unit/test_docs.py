"""The docs name only what exists: repository paths, PROCMESH_* variables, console scripts, make targets.

Each check reads the code for the truth (the file system, the settings classes and the source, the
three pyproject.toml files, the Makefile) rather than a list kept by hand, so a rename that forgets
the docs fails here. The last tests feed the checks a made-up document, so they are known to bite.
"""

from __future__ import annotations

import itertools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from procmesh import ProcessorSettings
from procmesh_orchestrator import OrchestratorSettings
from procmesh_orchestrator.config import ENV_PREFIX
from tests.conftest import REPO

DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "proto" / "README.md",
        REPO / "sdk" / "README.md",
        REPO / "sidecars" / "README.md",
        REPO / "orchestrator" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)

PACKAGES = {"procmesh": "sdk", "procmesh_orchestrator": "orchestrator", "procmesh_sidecars": "sidecars"}
"""An import package's path (`procmesh_orchestrator/run/loop.py`) is read inside its distribution."""

RETIRED_ENV = {"PROCMESH_CONFIG": "renamed PROCMESH_CONFIG_FILE; the code reads it only to say so"}

SOURCE_DIRS = (
    "sdk/procmesh",
    "sdk/node/lib",
    "sdk/node/scripted",
    "orchestrator",
    "sidecars",
    "bench",
    "tests",
)

SOURCE_SUFFIXES = {".py", ".js", ".mjs"}


@dataclass(frozen=True, repr=False)
class Doc:
    """A markdown file split into what the checks read: inline code spans and fenced blocks."""

    path: Path
    spans: list[str]
    blocks: list[tuple[str, str]]  # (language, body)
    links: list[str]
    text: str

    @classmethod
    def parse(cls, path: Path, text: str | None = None) -> Doc:
        text = path.read_text(encoding="utf-8") if text is None else text
        blocks = [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        # a span may wrap onto the next line but not across a paragraph (CommonMark)
        paragraphs = re.split(r"\n\s*\n", prose)
        found = [re.finditer(r"``\s?(.+?)\s?``|`([^`]+)`", par, flags=re.S) for par in paragraphs]
        spans = [" ".join((m[1] or m[2]).split()) for m in itertools.chain(*found)]
        links = re.findall(r"\]\(([^)\s]+)\)", prose)
        return cls(path, spans, blocks, links, text)

    def commands(self) -> list[str]:
        """Command lines: shell blocks' lines and inline spans of more than one word."""
        lines = [line for lang, body in self.blocks if lang in ("sh", "") for line in body.splitlines()]
        return [*lines, *(s for s in self.spans if " " in s.strip())]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.as_posix()


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

    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", path], check=False).returncode == 0


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
    for link in doc.links:
        target = link.split("#")[0]
        if not target or re.match(r"\w+:", target):
            continue
        if not (here / target).exists():
            problems.append(f"{_rel(doc.path)}: link target {link} does not exist")
    return problems


def layout_problems(doc: Doc) -> list[str]:
    """The README's "Project layout" block: every entry in its first column exists.

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


# -- metric names --------------------------------------------------------------------------------


def metric_problems(doc: Doc) -> list[str]:
    """Every procmesh_* metric name in the doc is one a collector registers (a string in the source)."""
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in ("sdk/procmesh", "orchestrator/procmesh_orchestrator")
        for path in (REPO / folder).rglob("*.py")
    )
    names = set(re.findall(r"\bprocmesh_[a-z_]*[a-z]\b", doc.text)) - set(PACKAGES)
    missing = [name for name in sorted(names) if f'"{name}"' not in source]
    return [f"{_rel(doc.path)}: metric {name} is not registered" for name in missing]


# -- environment variables -----------------------------------------------------------------------


def known_env() -> set[str]:
    """The PROCMESH_* variables the code reads: settings fields with their prefix, and source literals."""
    names = set()
    for settings in (OrchestratorSettings, ProcessorSettings):
        prefix = settings.model_config.get("env_prefix", "")
        names |= {f"{prefix}{field}".upper() for field in settings.model_fields}
    for folder in SOURCE_DIRS:
        for path in (REPO / folder).rglob("*"):
            if path.suffix not in SOURCE_SUFFIXES or "node_modules" in path.parts or path == Path(__file__):
                continue
            names |= set(re.findall(r"PROCMESH_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    names |= set(re.findall(r"PROCMESH_[A-Z0-9_]*[A-Z0-9]", (REPO / "Makefile").read_text(encoding="utf-8")))
    return names - set(RETIRED_ENV)


def env_problems(doc: Doc, known: set[str]) -> list[str]:
    """Every PROCMESH_* name in the doc that no code reads (PROCMESH_CONFIG__<KEY> overrides aside)."""
    problems = []
    for name in sorted(set(re.findall(r"PROCMESH_[A-Z0-9_]*", doc.text))):
        if name == "PROCMESH_" or name.startswith(ENV_PREFIX):  # `PROCMESH_*`, the family
            continue  # the documented override pattern: PROCMESH_CONFIG__<KEY>__<KEY>...
        if name.rstrip("_") not in known:
            why = RETIRED_ENV.get(name.rstrip("_"), "no code reads it")
            problems.append(f"{_rel(doc.path)}: {name}: {why}")
    return problems


# -- console scripts -----------------------------------------------------------------------------


def pyprojects() -> list[dict[str, object]]:
    folders = ("sdk", "orchestrator", "sidecars")
    return [tomllib.loads((REPO / folder / "pyproject.toml").read_text()) for folder in folders]


def console_scripts() -> set[str]:
    """Every [project.scripts] name of the three distributions."""
    return {name for p in pyprojects() for name in p["project"].get("scripts", {})}  # type: ignore[attr-defined]


def _program(line: str) -> str:
    """The program a command line runs: past `VAR=value` assignments, `$ ` and a `.venv/bin/` path."""
    words = line.strip().removeprefix("$ ").split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    return words[0].rsplit("/", 1)[-1] if words else ""


def script_problems(doc: Doc, scripts: set[str]) -> list[str]:
    """Every `procmesh*` program a command runs that no distribution declares as a console script."""
    problems = []
    for line in doc.commands():
        program = _program(line)
        if re.fullmatch(r"procmesh[\w-]*", program) and program not in scripts:
            problems.append(f"{_rel(doc.path)}: `{line.strip()}` runs {program}, not a console script")
    return problems


# -- make targets --------------------------------------------------------------------------------


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-zA-Z][\w-]*):", text, flags=re.M))


def make_problems(doc: Doc, targets: set[str]) -> list[str]:
    """Every `make X` in a code span or block whose target the Makefile lacks."""
    code = "\n".join([*doc.spans, *(body for _, body in doc.blocks)])
    return [
        f"{_rel(doc.path)}: make {target}: no such target"
        for target in sorted(set(re.findall(r"(?<![\w-])make ([a-z][\w-]*)", code)))
        if target not in targets
    ]


# -- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return [Doc.parse(path) for path in DOCS]


def test_every_doc_is_checked() -> None:
    assert len(DOCS) >= 10
    assert all(path.exists() for path in DOCS)


def test_repository_paths_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in path_problems(doc)] == []


def test_the_layout_block_lists_what_exists(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in layout_problems(doc)] == []


def test_metric_names_are_registered(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in metric_problems(doc)] == []


def test_environment_variables_are_read_by_the_code(docs: list[Doc]) -> None:
    known = known_env()
    assert [p for doc in docs for p in env_problems(doc, known)] == []


def test_console_scripts_are_declared(docs: list[Doc]) -> None:
    scripts = console_scripts()
    assert [p for doc in docs for p in script_problems(doc, scripts)] == []
    readme = next(doc for doc in docs if doc.path == REPO / "README.md")
    assert [s for s in sorted(scripts) if f"`{s}" not in readme.text] == []  # and the README names each


def test_make_targets_exist(docs: list[Doc]) -> None:
    targets = make_targets()
    assert [p for doc in docs for p in make_problems(doc, targets)] == []


def test_the_checks_catch_made_up_names() -> None:
    fake = Doc.parse(
        REPO / "docs" / "made-up.md",
        "The loop is in `orchestrator/agent.py` and `orchestrator/procmesh_orchestrator/run/loop.py`;\n"
        "see [it](architecture.md) and [that](nowhere.md). Set `PROCMESH_CONFIG=x.yaml` or\n"
        "`PROCMESH_NO_SUCH_SETTING`; `PROCMESH_CONFIG__AGENTS__A__MAX_STEPS=3` and `PROCMESH_CONFIG_FILE`\n"
        "are fine. Run `procmesh-frobnicate --now` or `make frobnicate`, not `make test`.\n\n"
        "Count `procmesh_runs_total` and `procmesh_frobs_total`.\n\n"
        "```sh\n.venv/bin/procmesh-sidecar examples\nPROCMESH_X=1 procmesh-nothing\n```\n\n"
        "## Project layout\n\n```\norchestrator/procmesh_orchestrator/\n  app.py      the App\n"
        "  agent.py    gone\n              a description, not an entry\nMakefile, frob/   two\n```\n",
    )
    assert path_problems(fake) == [
        "docs/made-up.md: `orchestrator/agent.py` does not exist",
        "docs/made-up.md: link target nowhere.md does not exist",
    ]
    assert env_problems(fake, known_env()) == [
        f"docs/made-up.md: PROCMESH_CONFIG: {RETIRED_ENV['PROCMESH_CONFIG']}",
        "docs/made-up.md: PROCMESH_NO_SUCH_SETTING: no code reads it",
        "docs/made-up.md: PROCMESH_X: no code reads it",
    ]
    assert script_problems(fake, console_scripts()) == [
        "docs/made-up.md: `PROCMESH_X=1 procmesh-nothing` runs procmesh-nothing, not a console script",
        "docs/made-up.md: `procmesh-frobnicate --now` runs procmesh-frobnicate, not a console script",
    ]
    assert make_problems(fake, make_targets()) == ["docs/made-up.md: make frobnicate: no such target"]
    assert metric_problems(fake) == ["docs/made-up.md: metric procmesh_frobs_total is not registered"]
    assert layout_problems(fake) == [
        "docs/made-up.md: layout entry orchestrator/procmesh_orchestrator/agent.py does not exist",
        "docs/made-up.md: layout entry frob/ does not exist",
    ]


def test_settings_names_come_from_the_classes() -> None:
    """The derived names are the real ones: a field the service reads, and one of the SDK's."""
    known = known_env()
    assert {"PROCMESH_CONFIG_FILE", "PROCMESH_HTTP_PORT", "PROCMESH_LISTEN", "PROCMESH_METRICS_PORT"} <= known
    assert "PROCMESH_CONFIG" not in known
