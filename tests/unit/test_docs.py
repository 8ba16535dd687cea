"""The docs name only what exists: repository paths, links and their anchors, PROCMESH_* variables,
console scripts and their flags, make targets, metrics, RPC counts, the layout listing, config keys.

Each check reads the code for the truth (the file system, the settings classes and the source, the
three pyproject.toml files and the parsers of their console scripts, the Makefile, the .proto files,
the config models) rather than a list kept by hand, so a rename that forgets the docs fails here.
The `test_the_checks_catch_*` tests feed the checks made-up documents, so they are known to bite.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from procmesh import ProcessorSettings, settings_parser
from procmesh_orchestrator import CallOptions, OrchestratorSettings
from procmesh_orchestrator.config import ENV_PREFIX
from tests.conftest import REPO
from tests.fixtures import snippets

DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "proto" / "README.md",
        REPO / "sdk" / "README.md",
        REPO / "sdk" / "node" / "README.md",
        REPO / "sidecars" / "README.md",
        REPO / "orchestrator" / "README.md",
        REPO / "bench" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)

GITHUB = "https://github.com/procmesh/procmesh/"
"""Where the package pages (sdk/README.md is PyPI's page) link into the repository: checked like a
relative link (the path after blob/main/ or tree/main/)."""

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


ORCHESTRATOR = "orchestrator/procmesh_orchestrator/"


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


def missing_packages(entries: set[str]) -> list[str]:
    """Every package folder of the orchestrator (a folder with an __init__.py) the listing lacks."""
    packages = sorted(p.parent for p in (REPO / ORCHESTRATOR).glob("*/__init__.py"))
    return [f"{_rel(p)}/" for p in packages if f"{_rel(p)}/" not in entries]


# -- RPC counts ----------------------------------------------------------------------------------

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
"""Counts the docs may spell out."""


def proto_services() -> dict[str, tuple[str, list[str]]]:
    """Each service of proto/procmesh/v1: its file name and its RPCs' names, in order."""
    services = {}
    for path in sorted((REPO / "proto" / "procmesh" / "v1").glob("*.proto")):
        text = path.read_text(encoding="utf-8")
        for name, body in re.findall(r"^service (\w+) \{(.*?)^\}", text, flags=re.M | re.S):
            services[name] = (path.name, re.findall(r"^\s*rpc (\w+)\(", body, flags=re.M))
    return services


def rpc_count_problems(doc: Doc, services: dict[str, tuple[str, list[str]]]) -> list[str]:
    """Every "has N RPCs" names the count of the service the text before it last named (by its
    name or its .proto file), and every RPC listed after it in backticks is one of that service's."""
    problems = []
    for match in re.finditer(r"\bhas (\d+|[a-z]+) RPCs\b(:[^.]*)?", doc.text):
        before = doc.text[: match.start()]
        named = [
            (before.rfind(key), service) for service, (file, _) in services.items() for key in (service, file)
        ]
        where, service = max(named)
        if where < 0:
            problems.append(f"{_rel(doc.path)}: '{match[0][:40]}' names no service before it")
            continue
        rpcs = services[service][1]
        said = int(match[1]) if match[1].isdigit() else NUMBERS.get(match[1], -1)
        if said != len(rpcs):
            problems.append(f"{_rel(doc.path)}: {service} has {len(rpcs)} RPCs, not {match[1]}")
        listed = re.findall(r"`(\w+)`", match[2] or "")
        problems += [f"{_rel(doc.path)}: {service} has no RPC {name}" for name in listed if name not in rpcs]
    return problems


# -- command-line flags --------------------------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """A parser's option strings, its subcommands' included."""
    found = set()
    for action in parser._actions:
        found |= {o for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def cli_flags() -> dict[str, set[str]]:
    """The flags each console script's parser takes, read from the parser itself: each script's
    entry point (pyproject.toml) runs until it parses, and the parser is taken there. `python
    SCRIPT.py` stands for a processor served with procmesh.run (the SDK's settings parser)."""
    import importlib

    def parsed(*args: object, **kwargs: object) -> NoReturn:
        raise _Parsed(args[0])  # type: ignore[arg-type]

    flags: dict[str, set[str]] = {"python": _options(settings_parser())}
    scripts: list[dict[str, str]] = [p["project"].get("scripts", {}) for p in pyprojects()]  # type: ignore[attr-defined]
    entry_points = {name: ref for table in scripts for name, ref in table.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parsed)
        patch.setattr(argparse.ArgumentParser, "parse_known_args", parsed)
        for name, ref in entry_points.items():
            module, function = ref.split(":")
            try:
                getattr(importlib.import_module(module), function)([])
            except _Parsed as caught:
                flags[name] = _options(caught.parser)
    flags["procmesh"] |= flags["procmesh-check-sidecar"]  # `procmesh check-sidecar` is that checker
    return flags


def _command_lines(doc: Doc) -> list[str]:
    """Command lines with their continuation lines joined (a line ending in a backslash)."""
    bodies = [body.replace("\\\n", " ") for lang, body in doc.blocks if lang in ("sh", "")]
    lines = [" ".join(line.split()) for body in bodies for line in body.splitlines()]
    return [*lines, *(s for s in doc.spans if " " in s.strip())]


def flag_problems(doc: Doc, flags: dict[str, set[str]]) -> list[str]:
    """Every --flag of a command that runs one of ours (a console script, or `python SCRIPT.py` serving
    processors) is one its parser takes; a lone `--flag` span is one some parser of ours takes."""
    problems = []
    everyone = set().union(*flags.values())
    for line in _command_lines(doc):
        program = _program(line)
        words = line.split()
        if program.startswith("python"):  # your own processor script, not `python -m grpc_tools.protoc`
            ours = len(words) > 1 and words[1].endswith(".py") and "/" not in words[1]  # nor ../shared/...
            program = "python" if ours else ""
        if program not in flags:
            continue
        code = line.split("#", 1)[0]  # a shell comment
        code = re.sub(r"\"[^\"]*\"|'[^']*'", "", code)  # a quoted argument (another command's flags)
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", code):
            if flag not in flags[program]:
                problems.append(f"{_rel(doc.path)}: `{line.strip()[:60]}`: {program} takes no {flag}")
    for span in doc.spans:
        for flag in re.findall(r"^--[a-z][a-z0-9-]*(?=[ =]|$)", span):
            if flag not in everyone:
                problems.append(f"{_rel(doc.path)}: `{span[:40]}`: no command of ours takes {flag}")
    return problems


# -- python examples ----------------------------------------------------------------------------

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


# -- the config reference ------------------------------------------------------------------------


def config_keys() -> dict[str, set[str]]:
    """The keys a user writes, by config model (`agents.ID.costControl`: AgentConfig's costControl)."""
    from pydantic import BaseModel

    from procmesh_orchestrator.config import schema, tools

    models: list[type[BaseModel]] = [
        schema.Config,
        schema.AgentConfig,
        schema.SidecarConfig,
        schema.ProcessorRef,
    ]
    models += [schema.StorageConfig, schema.AgentMemoryConfig, schema.ModelConfig]
    models += [tools.ToolConfig, tools.McpServerConfig]
    return {
        model.__name__: {
            field.alias or name for name, field in model.model_fields.items() if not field.exclude
        }
        for model in models
    }


def config_problems(doc: Doc, keys: dict[str, set[str]]) -> list[str]:
    """Every key of those models appears in the configuration page's prose or tables."""
    return [
        f"{_rel(doc.path)}: {model}'s key {key} is not documented"
        for model, names in keys.items()
        for key in sorted(names)
        if not re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", doc.text)
    ]


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
        "## Project layout\n\n```\norchestrator/procmesh_orchestrator/\n  errors.py   the errors\n"
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


def test_the_layout_lists_every_orchestrator_package() -> None:
    architecture = Doc.parse(REPO / "docs" / "architecture.md")
    entries = layout_entries(architecture)
    assert entries, "docs/architecture.md has the Project layout block"
    assert missing_packages(entries) == []


def test_rpc_counts_match_the_protos(docs: list[Doc]) -> None:
    services = proto_services()
    assert len(services["AgentService"][1]) >= 8  # the parse found them
    assert [p for doc in docs for p in rpc_count_problems(doc, services)] == []
    said = [doc for doc in docs if re.search(r"AgentService.{0,80}has \d+ RPCs", doc.text, flags=re.S)]
    assert said, "docs/service.md says how many RPCs AgentService has"


def test_flags_in_the_docs_are_taken_by_the_commands(docs: list[Doc]) -> None:
    flags = cli_flags()
    assert set(console_scripts()) <= set(flags)  # every script's parser was reached
    assert {"--hook-threads", "--no-hook-threads"} <= flags["procmesh-sidecar"]
    assert "--grpc-socket" in flags["procmesh-orchestrator"]
    assert [p for doc in docs for p in flag_problems(doc, flags)] == []


def test_python_examples_import_what_exists(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in import_problems(doc)] == []


def test_the_configuration_page_names_every_key() -> None:
    page = Doc.parse(REPO / "docs" / "configuration.md")
    assert [p for p in config_problems(page, config_keys())] == []


def test_the_python_api_page_names_every_call_option() -> None:
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    table = page.split("## CallOptions", 1)[1].split("\n## ", 1)[0]
    assert [f.name for f in dataclasses.fields(CallOptions) if f"`{f.name}`" not in table] == []


def test_the_new_checks_catch_made_up_claims() -> None:
    services = proto_services()
    fake = Doc.parse(
        REPO / "docs" / "made-up.md",
        "# Title\n\n## A section\n\nSee [this](#a-section), [that](#nowhere), [it](service.md#no-such),\n"
        "[the face](https://github.com/procmesh/procmesh/blob/main/docs/nothing.md) and\n"
        "[home](https://github.com/procmesh/procmesh/issues).\n\n"
        "`procmesh.v1.AgentService` has two RPCs: `Generate` and `Frobnicate`.\n\n"
        "Run `procmesh-orchestrator --config x.yaml --frob` or `procmesh-sidecar examples --hook-threads`,\n"
        "`python mine.py --listen x --nope`; `--no-such-flag` and `--listen ADDR` alone.\n\n"
        "```sh\nprocmesh stream a hi \\\n  --config c.yaml --made-up   # --in-a-comment\n"
        "kubectl apply --whatever\n```\n\n"
        "```python\nfrom procmesh_orchestrator import App, GrpcThing\n"
        "from procmesh_orchestrator.run import Agent\n```\n",
    )
    assert link_problems(fake) == [
        "docs/made-up.md: link #nowhere: no heading #nowhere in docs/made-up.md",
        "docs/made-up.md: link service.md#no-such: no heading #no-such in docs/service.md",
        f"docs/made-up.md: link target {GITHUB}blob/main/docs/nothing.md does not exist",
    ]
    assert rpc_count_problems(fake, services) == [
        f"docs/made-up.md: AgentService has {len(services['AgentService'][1])} RPCs, not two",
        "docs/made-up.md: AgentService has no RPC Frobnicate",
    ]
    made_up = "docs/made-up.md: `procmesh stream a hi --config c.yaml --made-up # --in-a-comm`"
    assert flag_problems(fake, cli_flags()) == [
        f"{made_up}: procmesh takes no --made-up",
        "docs/made-up.md: `procmesh-orchestrator --config x.yaml --frob`: "
        "procmesh-orchestrator takes no --frob",
        "docs/made-up.md: `python mine.py --listen x --nope`: python takes no --nope",
        "docs/made-up.md: `--no-such-flag`: no command of ours takes --no-such-flag",
    ]
    assert import_problems(fake) == [
        "docs/made-up.md: procmesh_orchestrator does not export GrpcThing",
        "docs/made-up.md: import from the face, not procmesh_orchestrator.run",
    ]
    assert missing_packages({"orchestrator/procmesh_orchestrator/run/"}) != []
    assert "orchestrator/procmesh_orchestrator/service/" in missing_packages({"x"})
    keys = config_keys()
    assert config_problems(Doc.parse(REPO / "docs" / "made-up.md", "`sidecars` and `agents`"), keys)[:1] == [
        "docs/made-up.md: Config's key decisions is not documented"
    ]


def test_every_code_block_of_the_contract_pages_is_named_and_run_by_a_test() -> None:
    # proto/README.md and docs/other-languages.md are what an author in another language copies
    # from: each block carries a `<!-- snippet: NAME -->` marker, and a test reads it by that name
    # (tests/fixtures/snippets.py) and runs it, or parses it where it is a sketch.
    tests = "\n".join(
        p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("test_*.py") if p.name != "test_docs.py"
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
