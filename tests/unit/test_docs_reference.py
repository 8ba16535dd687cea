"""The docs' reference claims hold: they name only routes the HTTP API serves and subcommands
`procmesh` has; their settings tables give every setting with its real default (docs/service.md:
`OrchestratorSettings`; docs/processors.md: the SDK's `ProcessorSettings`), each with its own flags;
their config tables give each key's real default, and `required` exactly for the keys the schema
requires, and a section's default mapping (`judgeCache`) its real values; the configuration page
names every key a user writes (the API pages' fields and arguments: test_docs_fields.py).

Like the other tests/unit/test_docs_*.py, each check reads the truth from the code (the HTTP app's
route table, the CLI's parser, the settings classes, the config models), and
`test_the_checks_catch_made_up_claims` feeds them made-up documents.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from starlette.routing import BaseRoute, Match

from procmesh import ProcessorSettings, settings_parser
from procmesh_orchestrator import OrchestratorSettings
from procmesh_orchestrator.service.http.app import build_http_app
from tests.conftest import REPO
from tests.unit.doc_pages import Doc, _command_lines, _rel, made_up, missing_packages

SETTINGS_TABLES = {"docs/service.md": OrchestratorSettings, "docs/processors.md": ProcessorSettings}
MIB = 1024 * 1024

# -- routes --------------------------------------------------------------------------------------


def served_routes() -> list[BaseRoute]:
    """The HTTP app's route table (its 501 routes too: the docs list those as answered 501)."""
    settings = OrchestratorSettings(config_file="unused.yaml")
    app = build_http_app(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
    return list(app._app.routes)  # type: ignore[attr-defined]  # the Starlette app inside the Boundary


def route_problems(doc: Doc, routes: list[BaseRoute]) -> list[str]:
    """Every ``METHOD /path`` the doc names is a route of the table; a path parameter is written
    ``{name}`` or ``:name``, an optional tail ``[/{toolId}]``."""
    problems = []
    for method, path in sorted(set(re.findall(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`|),;]*)", doc.text))):
        concrete = re.sub(r"\{[^}]*\}|:[A-Za-z]\w*", "x", path.split("?")[0]).rstrip(".")
        variants = {re.sub(r"\[[^\]]*\]", "", concrete), re.sub(r"[\[\]]", "", concrete)}
        scopes = [{"type": "http", "path": v, "method": method, "root_path": ""} for v in variants]
        if not all(any(r.matches(s)[0] == Match.FULL for r in routes) for s in scopes):
            problems.append(f"{_rel(doc.path)}: {method} {path} is no route of the HTTP API")
    return problems


# -- settings tables -----------------------------------------------------------------------------


def table_rows(text: str) -> list[dict[str, str]]:
    """Every row of the doc's tables that have a default column, by header."""
    rows: list[dict[str, str]] = []
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not header:
            header = cells
        elif not set("".join(cells)) <= {"-", ":", " "} and "default" in header:
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def spellings(value: Any) -> set[str]:
    """How a table may write a default: `true`, `30` for 30.0, `4 MiB`, `["a"]` or `a`, `{}`."""
    if isinstance(value, bool):
        return {str(value).lower()}
    if isinstance(value, int | float):
        found = {str(int(value)) if float(value).is_integer() else str(value)}
        return found | ({f"{value / MIB:g} MiB"} if value >= MIB and value % MIB == 0 else set())
    if isinstance(value, list):
        return {
            json.dumps(value),
            *([str(value[0])] if len(value) == 1 else []),
            *([] if value else ["none"]),
        }
    if isinstance(value, dict):
        return {json.dumps(value)}
    return {str(value)}


def settings_problems(doc: Doc, settings: type[BaseSettings]) -> list[str]:
    """Each setting of the class is named in a row's env column (``PROCMESH_<FIELD>``), and the row's
    default is the field's (a default computed at start, None here, is the doc's to explain)."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    fields = {f"{prefix}{name}".upper(): field for name, field in settings.model_fields.items()}
    problems, named = [], set()
    for row in table_rows(doc.text):
        envs = [
            e
            for e in re.findall(r"PROCMESH_[A-Z0-9_]*[A-Z0-9]", row.get("env / flag", row.get("env", "")))
            if e in fields
        ]
        named |= set(envs)
        given = [d.strip() for d in row["default"].split(", ")] if len(envs) > 1 else [row["default"]]
        for env, cell in zip(envs, given if len(given) == len(envs) else [""] * len(envs), strict=True):
            default = fields[env].default
            said = cell.replace("`", "").split(" (")[0].strip()
            if default is not None and said not in spellings(default):
                problems.append(f"{_rel(doc.path)}: {env} defaults to {default!r}, not {cell!r}")
    problems += [f"{_rel(doc.path)}: no row names {env}" for env in sorted(set(fields) - named)]
    return problems


def settings_parser_of(settings: type[BaseSettings]) -> argparse.ArgumentParser:
    """The parser whose flags set the class's settings: the SDK's, or procmesh-orchestrator's."""
    from procmesh_orchestrator.__main__ import main

    return settings_parser() if settings is ProcessorSettings else parser_of(main)


def flag_pairing_problems(
    doc: Doc, settings: type[BaseSettings], parser: argparse.ArgumentParser
) -> list[str]:
    """A settings row's flags are exactly the flags of the settings its env column names (a row
    giving `PROCMESH_HTTP_PORT` beside `--grpc-port` sends the reader to the wrong flag)."""
    prefix = str(settings.model_config.get("env_prefix", "")).upper()
    flags: dict[str, set[str]] = {}
    for action in parser._actions:
        flags.setdefault(f"{prefix}{action.dest}".upper(), set()).update(
            o for o in action.option_strings if o.startswith("--")
        )
    problems = []
    for row in table_rows(doc.text):
        column = row.get("env / flag", row.get("env", "")) + " " + row.get("flag", "")
        envs = re.findall(r"PROCMESH_[A-Z0-9_]*[A-Z0-9]", column)
        said = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", column))
        want = set().union(*(flags.get(env, set()) for env in envs)) if envs else set()
        if said != want:
            problems.append(
                f"{_rel(doc.path)}: {', '.join(envs)}: the flags are {sorted(want)}, not {sorted(said)}"
            )
    return problems


# -- config tables -------------------------------------------------------------------------------


def config_models() -> dict[str, type[BaseModel]]:
    """The model of each key prefix the config tables write (`agents.ID.maxSteps`: AgentConfig's)."""
    from procmesh_orchestrator.config import agents, providers, sidecars, tools
    from procmesh_orchestrator.store import StorageConfig

    return {
        "sidecars.NAME.": sidecars.SidecarConfig,
        "models.NAME.": providers.ModelConfig,
        "tools.NAME.": tools.ToolConfig,
        "agents.ID.memory.": agents.AgentMemoryConfig,
        "agents.ID.": agents.AgentConfig,
        "storage.": StorageConfig,
    }


def _field(key: str, models: dict[str, type[BaseModel]]) -> FieldInfo | None:
    for prefix, model in models.items():
        if key.startswith(prefix):
            name = key.removeprefix(prefix)
            return next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)
    return None


def config_table_problems(doc: Doc, models: dict[str, type[BaseModel]]) -> list[str]:
    """A key under a prefix of `models` (`agents.ID.maxSteps`) is a field of its model, and each
    row of a ``| key | default |`` table whose keys are all fields of `models` gives each
    field's default: `required` for a required field, its value for a fixed one (None, a default
    the code works out, as is "", is the row's to explain). ``.inputSchema`` after
    ``tools.NAME.description`` is its sibling."""
    problems = []
    for row in table_rows(doc.text):
        if "key" not in row:
            continue
        keys: list[str] = []
        for key in re.findall(r"`([^`]+)`", row["key"]):
            keys.append(keys[-1].rsplit(".", 1)[0] + key if key.startswith(".") and keys else key)
        fields = [_field(key, models) for key in keys]
        cells = [c.strip() for c in row["default"].split(", ")] if len(keys) > 1 else [row["default"]]
        problems += [
            f"{_rel(doc.path)}: {key} is no config key"
            for key, field in zip(keys, fields, strict=True)
            if field is None and any(key.startswith(p) and "." not in key.removeprefix(p) for p in models)
        ]
        prose = re.sub(r"`[^`]+`|[, ]", "", row["key"])  # `agents.ID.model` as a list: another form
        if not keys or prose or None in fields or len(cells) != len(keys):
            continue
        for key, field, cell in zip(keys, fields, cells, strict=True):
            assert field is not None
            said = cell.replace("`", "").split(" (")[0].strip()
            if field.is_required():
                wrong = said != "required"
            elif field.default_factory is not None:
                wrong = said not in spellings(field.default_factory())  # type: ignore[call-arg]
            else:  # None or "": a default the code works out (`baseUrl`: the kind's public API)
                wrong = field.default not in (None, "") and said not in spellings(field.default)
            if wrong:
                want = "required" if field.is_required() else "its default"
                problems.append(f"{_rel(doc.path)}: {key}'s default is not {cell!r} ({want})")
    return problems


# -- procmesh subcommands --------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def procmesh_parser() -> argparse.ArgumentParser:
    """The `procmesh` CLI's parser."""
    from procmesh_orchestrator.cli.main import main

    return parser_of(main)


def parser_of(main: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """A console script's parser, taken where it parses (as test_docs_commands.cli_flags takes it)."""

    class Parsed(Exception):
        pass

    def parsed(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        raise Parsed(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parsed)
        try:
            main([])
        except Parsed as caught:
            return caught.args[0]  # type: ignore[no-any-return]
    raise AssertionError(f"{main.__module__}.main never parsed its arguments")


def subcommand_problems(doc: Doc, parser: argparse.ArgumentParser) -> list[str]:
    """Every `procmesh WORD [WORD]` command line names subcommands the parser has (a placeholder in
    capitals and `generate|stream` alternatives are read as such)."""
    problems = []
    for line in _command_lines(doc):
        words = line.split("#", 1)[0].split()
        if len(words) < 2 or words[0] != "procmesh":
            continue
        choices = _subcommands(parser)
        for word in words[1:3]:
            if not choices or word.startswith(("-", "<")) or word.isupper():
                break
            for name in word.split("|"):
                if name not in choices:
                    problems.append(f"{_rel(doc.path)}: `{line[:60]}`: procmesh has no subcommand {name}")
            choices = _subcommands(choices.get(word.split("|")[0], argparse.ArgumentParser()))
    return problems


# -- the tests -----------------------------------------------------------------------------------


def test_routes_in_the_docs_are_served(docs: list[Doc]) -> None:
    routes = served_routes()
    assert len(routes) > 50  # the table was reached
    assert [p for doc in docs for p in route_problems(doc, routes)] == []


@pytest.mark.parametrize("page", sorted(SETTINGS_TABLES))
def test_the_settings_tables_give_every_setting_and_its_default(page: str) -> None:
    doc = Doc.parse(REPO / page)
    assert len(table_rows(doc.text)) >= 10  # the table was found
    assert settings_problems(doc, SETTINGS_TABLES[page]) == []
    assert flag_pairing_problems(doc, SETTINGS_TABLES[page], settings_parser_of(SETTINGS_TABLES[page])) == []


def test_the_checks_catch_made_up_claims() -> None:
    fake = made_up(
        "`POST /api/agents/{id}/frobnicate`, `GET /api/agents/:agentId` and\n"
        "`PUT /api/agents/{id}/generate`.\n\n"
        "| setting | env / flag | default | meaning |\n| --- | --- | --- | --- |\n"
        "| http_host, http_port | `PROCMESH_HTTP_HOST`, `PROCMESH_HTTP_PORT` | `127.0.0.1`, `8080` | |\n"
        "| max_request_bytes | `PROCMESH_MAX_REQUEST_BYTES` | 4 MiB | |\n"
        "| abort_on_disconnect | `PROCMESH_ABORT_ON_DISCONNECT` | false | |\n",
    )
    assert route_problems(fake, served_routes()) == [
        "docs/made-up.md: POST /api/agents/{id}/frobnicate is no route of the HTTP API",
        "docs/made-up.md: PUT /api/agents/{id}/generate is no route of the HTTP API",
    ]
    problems = settings_problems(fake, OrchestratorSettings)
    assert problems[:2] == [
        "docs/made-up.md: PROCMESH_HTTP_PORT defaults to 4111, not '`8080`'",
        "docs/made-up.md: PROCMESH_ABORT_ON_DISCONNECT defaults to True, not 'false'",
    ]
    assert "docs/made-up.md: no row names PROCMESH_API_KEYS" in problems
    flagged = made_up(
        "| setting | env / flag | default |\n| --- | --- | --- |\n"
        "| http_port | `PROCMESH_HTTP_PORT` / `--grpc-port` | `4111` |\n"
        "| log_level | `PROCMESH_LOG_LEVEL` / `--log-level` | `INFO` |\n",
    )
    assert flag_pairing_problems(flagged, OrchestratorSettings, settings_parser_of(OrchestratorSettings)) == [
        "docs/made-up.md: PROCMESH_HTTP_PORT: the flags are ['--http-port'], not ['--grpc-port']"
    ]
    config = made_up(
        "| key | default | meaning |\n|---|---|---|\n| `sidecars.NAME.address` | `localhost` | |\n"
        "| `sidecars.NAME.timeout`, `.onFailure` | `10`, `fail-open` | |\n| `agents.ID.maxSteps` | `5` | |\n"
        "| `agents.ID.memory.lastMessages` | required | |\n| `storage.maxConnections` | `10` | |\n"
        "| `agents.ID.maxStep` | `5` | |\n",
    )
    assert config_table_problems(config, config_models()) == [
        "docs/made-up.md: sidecars.NAME.address's default is not '`localhost`' (required)",
        "docs/made-up.md: sidecars.NAME.timeout's default is not '`10`' (its default)",
        "docs/made-up.md: sidecars.NAME.onFailure's default is not '`fail-open`' (its default)",
        "docs/made-up.md: agents.ID.memory.lastMessages's default is not 'required' (its default)",
        "docs/made-up.md: agents.ID.maxStep is no config key",
    ]
    commands = made_up(
        "```sh\nprocmesh frob a\nprocmesh scenario walk x\nprocmesh generate|stream AGENT TEXT\n```\n",
    )
    assert subcommand_problems(commands, procmesh_parser()) == [
        "docs/made-up.md: `procmesh frob a`: procmesh has no subcommand frob",
        "docs/made-up.md: `procmesh scenario walk x`: procmesh has no subcommand walk",
    ]


def test_procmesh_subcommands_in_the_docs_exist(docs: list[Doc]) -> None:
    parser = procmesh_parser()
    assert {"generate", "stream", "replay"} <= set(_subcommands(parser))
    assert [p for doc in docs for p in subcommand_problems(doc, parser)] == []


@pytest.mark.parametrize("page", ["docs/configuration.md", "docs/providers.md"])
def test_the_config_tables_give_each_keys_default(page: str) -> None:
    from procmesh_orchestrator.config import providers

    models = config_models()
    if page == "docs/providers.md":
        models = {"": providers.ProviderConfig}
    assert config_table_problems(Doc.parse(REPO / page), models) == []


def section_default_problems(text: str) -> list[str]:
    """A top-level key whose row gives its default as a mapping (`judgeCache`: `{enabled: false,
    ...}`) gives the section's real values for the keys it writes."""
    import yaml

    from procmesh_orchestrator.config.schema import Config

    fields = {field.alias or name: field for name, field in Config.model_fields.items()}
    problems = []
    for row in table_rows(text):
        key, cell = row.get("key", "").strip("`"), row.get("default", "").strip("`")
        field = fields.get(key)
        if field is None or not cell.startswith("{"):
            continue
        value = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        real = value.model_dump(by_alias=True) if isinstance(value, BaseModel) else value
        for name, given in yaml.safe_load(cell).items():
            got = real.get(name)
            got = got.model_dump(by_alias=True, exclude_defaults=True) if isinstance(got, BaseModel) else got
            if got != given:
                problems.append(f"docs/configuration.md: {key}.{name} defaults to {got!r}, not {given!r}")
    return problems


def test_the_sections_defaults_are_real() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "| `judgeCache` | `{" in text  # such rows exist
    assert section_default_problems(text) == []
    made_up = "| key | default |\n|---|---|\n| `judgeCache` | `{enabled: true, maxEntries: 5}` |\n"
    assert section_default_problems(made_up) == [
        "docs/configuration.md: judgeCache.enabled defaults to False, not True",
        "docs/configuration.md: judgeCache.maxEntries defaults to 10000, not 5",
    ]


def test_the_example_config_shown_is_the_file() -> None:
    """configuration.md shows examples/config.yaml ("This is examples/config.yaml:"): the block is
    the file, its header comment aside, so the page cannot show a config the repository lost."""
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    shown = re.search(r"```yaml\n(.*?)```", page.split("(../examples/config.yaml):", 1)[1], flags=re.S)
    lines = (REPO / "examples" / "config.yaml").read_text(encoding="utf-8").splitlines(keepends=True)
    assert shown is not None
    assert shown[1] == "".join(line for line in lines if not line.startswith("#")).lstrip("\n")


def test_the_orchestrators_page_names_every_package() -> None:
    """orchestrator/README.md's split by role names each top-level package (`store/`)."""
    page = Doc.parse(REPO / "orchestrator" / "README.md")
    named = {f"orchestrator/procmesh_orchestrator/{span}" for span in page.spans if span.endswith("/")}
    assert missing_packages(named) == []


def test_the_sdk_page_lists_every_flag_of_a_sidecar() -> None:
    """sdk/README.md's flags table names each flag `procmesh.run` takes (the other checks only
    require that the flags the docs name exist)."""
    text = (REPO / "sdk" / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Serving: flags and environment") : text.index("## Logs and metrics")]
    flags = {o for a in settings_parser()._actions for o in a.option_strings if o.startswith("--")}
    assert {"--listen", "--model-gateway-key"} <= flags  # the parser was read
    assert sorted(f for f in flags if not re.search(rf"`{re.escape(f)}[` ]", table)) == []


# -- the config reference ------------------------------------------------------------------------


def config_keys() -> dict[str, set[str]]:
    """The keys a user writes, by config model (`agents.ID.costControl`: AgentConfig's costControl)."""
    from procmesh_orchestrator.config import agents, lanes, providers, schema, sidecars, tools
    from procmesh_orchestrator.store import StorageConfig

    models: list[type[BaseModel]] = [
        schema.Config,
        agents.AgentConfig,
        sidecars.SidecarConfig,
        lanes.ProcessorRef,
    ]
    models += [StorageConfig, agents.AgentMemoryConfig, providers.ModelConfig]
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


def test_the_configuration_page_names_every_key() -> None:
    page = Doc.parse(REPO / "docs" / "configuration.md")
    assert [p for p in config_problems(page, config_keys())] == []


def test_the_key_check_catches_undocumented_keys() -> None:
    keys = config_keys()
    assert config_problems(made_up("`sidecars` and `agents`"), keys)[:1] == [
        "docs/made-up.md: Config's key decisions is not documented"
    ]
