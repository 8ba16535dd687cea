"""The docs' commands run what exists: every `procmesh*` program is a console script of one of the
three distributions (and the README names each), every --flag is one that command's parser takes
(a console script's, or a `python -m MODULE` of ours), every set `procmesh-sidecar` serves one it
has, every `make X` a Makefile target, every PROCMESH_* variable one the code reads, every value
given to a setting (`PROCMESH_API_KEYS=...`) one its settings class takes, and every API key list
of the mistake tables refused with the error the row quotes; and docs/running.md names every
Debian package `make deps` installs.

Each check reads the truth from the code (the three pyproject.toml files and the parsers of their
console scripts and modules, the Makefile, the settings classes and the source), and
`test_the_checks_catch_made_up_commands` feeds them made-up documents. This module's own source is
left out of the variables the code reads: its made-up documents name variables nobody reads.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from procmesh import ProcessorSettings, settings_parser
from procmesh_orchestrator import OrchestratorSettings
from procmesh_orchestrator.config import ENV_PREFIX
from tests.conftest import REPO
from tests.unit.doc_pages import Doc, _command_lines, _rel, made_up

RETIRED_ENV = {"PROCMESH_CONFIG": "renamed PROCMESH_CONFIG_FILE; the code reads it only to say so"}

REFUSED_EXAMPLES = {"PROCMESH_API_KEY", "PROCMESH_HOOK_THREAD", "PROCMESH_METRIC_PORT"}
"""Typos the docs show being refused at start (`procmesh.environment`): no code reads them, on
purpose (`test_the_typos_the_docs_show_are_refused`)."""

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


def _parser_flags(main: Callable[[], object]) -> set[str] | None:
    """The flags of the parser `main` builds: it runs until it parses, and the parser is taken
    there (None: it parsed nothing)."""

    def parsed(*args: object, **kwargs: object) -> NoReturn:
        raise _Parsed(args[0])  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parsed)
        patch.setattr(argparse.ArgumentParser, "parse_known_args", parsed)
        try:
            main()
        except _Parsed as caught:
            return _options(caught.parser)
    return None


def cli_flags() -> dict[str, set[str]]:
    """The flags each console script's parser takes, read from the parser itself: each script's
    entry point (pyproject.toml) runs until it parses. `python SCRIPT.py` stands for a processor
    served with procmesh.run (the SDK's settings parser)."""
    import importlib

    flags: dict[str, set[str]] = {"python": _options(settings_parser())}
    scripts: list[dict[str, str]] = [p["project"].get("scripts", {}) for p in pyprojects()]  # type: ignore[attr-defined]
    for name, ref in {name: ref for table in scripts for name, ref in table.items()}.items():
        module, function = ref.split(":")
        found = _parser_flags(functools.partial(getattr(importlib.import_module(module), function), []))
        if found is not None:
            flags[name] = found
    flags["procmesh"] |= flags["procmesh-check-sidecar"]  # `procmesh check-sidecar` is that checker
    return flags


OUR_MODULES = ("procmesh", "procmesh_orchestrator", "procmesh_sidecars", "bench")


def module_flags(docs: list[Doc]) -> dict[str, set[str]]:
    """The flags of each `python -m MODULE` of ours the docs run (`-m bench.p3_chunk_latency`), read
    from its parser as `cli_flags` reads a console script's: its `main` (a package's `__main__`'s)."""
    import importlib

    lines = [line for doc in docs for line in _command_lines(doc)]
    named = {m for line in lines for m in re.findall(r"python3? -m ([\w.]+)", line)}
    flags: dict[str, set[str]] = {}
    for name in sorted(m for m in named if m.split(".")[0] in OUR_MODULES):
        module = importlib.import_module(name)
        if hasattr(module, "__path__"):  # a package runs its __main__
            module = importlib.import_module(f"{name}.__main__")
        main = getattr(module, "main", None)
        if main is None or inspect.iscoroutinefunction(main):  # no parser (`python -m bench`)
            continue
        found = _parser_flags(main)
        if found is not None:
            flags[f"-m {name}"] = found
    return flags


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
            module = f"-m {words[words.index('-m') + 1]}" if "-m" in words[:-1] else ""
            program = "python" if ours else module
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


def sidecar_set_problems(doc: Doc, sets: set[str]) -> list[str]:
    """Every processor set a `procmesh-sidecar` (or `python -m procmesh_sidecars`) command serves is
    one it has (`examples`, `builtins`, a built-in's id); `SET...` and `...` are placeholders."""
    problems = []
    for line in _command_lines(doc):
        found = re.search(
            r"(?:procmesh-sidecar|python3? -m procmesh_sidecars)((?: [^-\s|;&#>$[][^\s|;&#>]*)+)", line
        )
        for word in found[1].split() if found else []:
            if word.strip(".") and not word.strip(".[]").isupper() and word not in sets:
                problems.append(
                    f"{_rel(doc.path)}: `{line.strip()[:60]}`: procmesh-sidecar has no set {word}"
                )
    return problems


def deps_problems(text: str) -> list[str]:
    """Every Debian package `make deps` installs (tests/deps.py's table) is named on the page."""
    from tests import deps

    packages = {p.package for p in deps.PROGRAMS if p.package} | {s.package for s in deps.SOURCES}
    return [
        f"docs/running.md: `make deps` installs {p}, unnamed"
        for p in sorted(packages)
        if f"`{p}`" not in text
    ]


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
        if name.rstrip("_") not in known and name not in REFUSED_EXAMPLES:
            why = RETIRED_ENV.get(name.rstrip("_"), "no code reads it")
            problems.append(f"{_rel(doc.path)}: {name}: {why}")
    return problems


SETTING = re.compile(r"""(PROCMESH_[A-Z0-9_]*[A-Z0-9])=('[^']*'|"[^"]*"|[^\s`'")]*[^\s`'"):;.,])""")


def _settings_given(doc: Doc) -> list[tuple[str, str]]:
    """Every `PROCMESH_NAME=VALUE` a command line or span sets (a span that is one assignment
    whole: its value may hold spaces, `PROCMESH_TRUSTED_CONTEXT={"*": ["*"]}`), unquoted."""
    given = []
    for line in [*_command_lines(doc), *doc.spans]:
        whole = re.fullmatch(r"(PROCMESH_[A-Z0-9_]*[A-Z0-9])=(.+)", line)
        found = [whole.groups()] if whole and line in doc.spans else SETTING.findall(line.split(" #", 1)[0])
        given += [(name, value[1:-1] if value[:1] in "'\"" else value) for name, value in found]
    return given


def setting_value_problems(doc: Doc) -> list[str]:
    """Every value the doc gives a setting of the orchestrator or a sidecar (`PROCMESH_<FIELD>=...`)
    is one the settings class takes from the environment, and an API key list one
    `procmesh-orchestrator` starts with (every entry bound: `key=resource`, `key=@operator`);
    `$(...)`, `<...>` and `...` are placeholders."""
    from procmesh_orchestrator.service._auth import KeyListError, parse_keys

    problems = []
    for name, value in _settings_given(doc):
        if any(mark in value for mark in ("$", "<", "...")):
            continue
        for settings in (OrchestratorSettings, ProcessorSettings):
            if name.removeprefix("PROCMESH_").lower() not in settings.model_fields:
                continue
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(name, value)
                try:
                    taken = settings()
                    if isinstance(taken, OrchestratorSettings):
                        parse_keys([key.get_secret_value() for key in taken.api_keys])
                except (ValueError, KeyListError) as error:
                    why = " ".join(str(error).split())[:90]
                    problems.append(f"{_rel(doc.path)}: {name}={value}: {settings.__name__}: {why}")
    return problems


KEY_TABLES = {"docs/service.md": "| mistake | message |", "docs/operations.md": "| start-up error |"}
"""The tables of `PROCMESH_API_KEYS` mistakes: a row's first cell shows a list in its first span,
its last span the start-up error it gives."""


def key_table_problems(path: str, text: str) -> list[str]:
    """Every example list of the page's key-mistake table is refused at start with the message the
    row quotes (`...` and `(...)` elide; `entry N` is any entry's number, a number is that one)."""
    from procmesh_orchestrator.service._auth import KeyListError, parse_keys

    table = text[text.index(KEY_TABLES[path]) :].split("\n\n", 1)[0].splitlines()[2:]
    problems = []
    for row in table:
        cells = row.strip("|").split(" | ")
        given, quoted = re.findall(r"`([^`]+)`", cells[0])[:1], re.findall(r"`([^`]+)`", cells[-1])[-1:]
        if not given or not quoted:
            continue
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PROCMESH_API_KEYS", given[0])
            try:
                parse_keys([key.get_secret_value() for key in OrchestratorSettings().api_keys])
                said = "(started)"
            except KeyListError as error:
                said = str(error)
        fragments = [re.escape(f.strip()) for f in re.split(r"\(\.\.\.\)|\.\.\.", quoted[0]) if f.strip()]
        pattern = ".*?".join(f.replace("entry\\ N", "entry\\ \\d+") for f in fragments)
        if not re.match(pattern, said):
            problems.append(f"{path}: {given[0]!r} gives {said[:90]!r}, not {quoted[0][:60]!r}")
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


def test_environment_variables_are_read_by_the_code(docs: list[Doc]) -> None:
    known = known_env()
    assert [p for doc in docs for p in env_problems(doc, known)] == []


def test_the_settings_values_in_the_docs_are_taken(docs: list[Doc]) -> None:
    assert len([given for doc in docs for given in _settings_given(doc)]) > 10  # the values were found
    assert [p for doc in docs for p in setting_value_problems(doc)] == []


@pytest.mark.parametrize("path", sorted(KEY_TABLES))
def test_the_api_key_mistakes_give_the_errors_the_tables_quote(path: str) -> None:
    text = (REPO / path).read_text(encoding="utf-8")
    assert key_table_problems(path, text) == []
    made_up = text.replace("repeats the key of entry 1", "repeats the key of entry 7", 1)
    assert [p.split(": ")[1] for p in key_table_problems(path, made_up)] == [
        "'k1=t1,k1=t2' gives 'PROCMESH_API_KEYS entry 2 repeats the key of entry 1"
    ]


def test_the_typos_the_docs_show_are_refused() -> None:
    from procmesh.environment import check_environment

    for component in ("orchestrator", "python-sidecar", "node-sidecar"):
        check = check_environment(component, dict.fromkeys(REFUSED_EXAMPLES, "x"))
        assert set(check.unknown) == REFUSED_EXAMPLES


def test_console_scripts_are_declared(docs: list[Doc]) -> None:
    scripts = console_scripts()
    assert [p for doc in docs for p in script_problems(doc, scripts)] == []
    readme = next(doc for doc in docs if doc.path == REPO / "README.md")
    assert [s for s in sorted(scripts) if f"`{s}" not in readme.text] == []  # and the README names each


def test_make_targets_exist(docs: list[Doc]) -> None:
    targets = make_targets()
    assert [p for doc in docs for p in make_problems(doc, targets)] == []


def test_settings_names_come_from_the_classes() -> None:
    """The derived names are the real ones: a field the service reads, and one of the SDK's."""
    known = known_env()
    assert {"PROCMESH_CONFIG_FILE", "PROCMESH_HTTP_PORT", "PROCMESH_LISTEN", "PROCMESH_METRICS_PORT"} <= known
    assert "PROCMESH_CONFIG" not in known


def test_flags_in_the_docs_are_taken_by_the_commands(docs: list[Doc]) -> None:
    flags = cli_flags() | module_flags(docs)
    assert {"--fused-only", "--chunks"} <= flags["-m bench.p3_chunk_latency"]  # a module's parser was read
    assert set(console_scripts()) <= set(flags)  # every script's parser was reached
    assert {"--hook-threads", "--no-hook-threads"} <= flags["procmesh-sidecar"]
    assert "--grpc-socket" in flags["procmesh-orchestrator"]
    assert [p for doc in docs for p in flag_problems(doc, flags)] == []


def test_the_packages_make_deps_installs_are_named() -> None:
    assert deps_problems((REPO / "docs" / "running.md").read_text(encoding="utf-8")) == []
    assert deps_problems("`redis-server`")[:1] == ["docs/running.md: `make deps` installs g++, unnamed"]


def test_sidecar_sets_exist(docs: list[Doc]) -> None:
    from procmesh_sidecars.__main__ import SETS

    assert {"examples", "builtins", "guards"} <= set(SETS)
    assert [p for doc in docs for p in sidecar_set_problems(doc, set(SETS))] == []


def test_the_checks_catch_made_up_commands() -> None:
    fake = made_up(
        "Set `PROCMESH_CONFIG=x.yaml` or\n"
        "`PROCMESH_NO_SUCH_SETTING`; `PROCMESH_CONFIG__AGENTS__A__MAX_STEPS=3` and `PROCMESH_CONFIG_FILE`\n"
        "are fine. Run `procmesh-frobnicate --now` or `make frobnicate`, not `make test`.\n\n"
        "```sh\n.venv/bin/procmesh-sidecar examples\nPROCMESH_X=1 procmesh-nothing\n```\n",
    )
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
    valued = made_up(
        'Set `PROCMESH_TRUSTED_CONTEXT={"*": ["*"]}`, `PROCMESH_HTTP_PORT=lots` or\n'
        "`PROCMESH_HOOK_THREADS=maybe`.\n\n"
        "```sh\nPROCMESH_API_KEYS=change-me procmesh-orchestrator   # unbound\n"
        "PROCMESH_API_KEYS='k1=tenant-a,k2=@operator' PROCMESH_LISTEN=$ADDR procmesh-orchestrator\n```\n",
    )
    assert [p.split(": ")[1] for p in setting_value_problems(valued)] == [
        "PROCMESH_API_KEYS=change-me",
        "PROCMESH_HTTP_PORT=lots",
        "PROCMESH_HOOK_THREADS=maybe",
    ]
    flagged = made_up(
        "Run `procmesh-orchestrator --config x.yaml --frob` or `procmesh-sidecar examples --hook-threads`,\n"
        "`python mine.py --listen x --nope`; `--no-such-flag` and `--listen ADDR` alone;\n"
        "`python -m bench.p3_chunk_latency --chunks 30 --frob`,\n"
        "`python -m procmesh_sidecars examples --nah`.\n\n"
        "```sh\nprocmesh stream a hi \\\n  --config c.yaml --made-up   # --in-a-comment\n"
        "kubectl apply --whatever\n```\n",
    )
    from procmesh_sidecars.__main__ import SETS

    served = made_up(
        "`procmesh-sidecar SET... [--listen ADDR]`, `procmesh-sidecar examples guards --listen x`,\n"
        "`python -m procmesh_sidecars ... --listen ADDR` and `procmesh-sidecar exampels`.\n",
    )
    assert sidecar_set_problems(served, set(SETS)) == [
        "docs/made-up.md: `procmesh-sidecar exampels`: procmesh-sidecar has no set exampels"
    ]
    streamed = "docs/made-up.md: `procmesh stream a hi --config c.yaml --made-up # --in-a-comm`"
    assert flag_problems(flagged, cli_flags() | module_flags([flagged])) == [
        f"{streamed}: procmesh takes no --made-up",
        "docs/made-up.md: `procmesh-orchestrator --config x.yaml --frob`: "
        "procmesh-orchestrator takes no --frob",
        "docs/made-up.md: `python mine.py --listen x --nope`: python takes no --nope",
        "docs/made-up.md: `python -m bench.p3_chunk_latency --chunks 30 --frob`: "
        "-m bench.p3_chunk_latency takes no --frob",
        "docs/made-up.md: `python -m procmesh_sidecars examples --nah`: -m procmesh_sidecars takes no --nah",
        "docs/made-up.md: `--no-such-flag`: no command of ours takes --no-such-flag",
    ]
