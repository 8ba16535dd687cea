"""The docs' configuration is one the orchestrator takes: every dotted key path in a code span
(`agents.ID.memory.semanticRecall`, `durable.eventLog.urlEnv`, `judgeCache.redis`) is a path of the
config's schema; every YAML example that is a config (or an agent's part of one) holds no key the
schema refuses and no value outside a key's choices; and a lane entry's `options` for a processor
this repository serves (`builtins/moderation`, `guards/topic-guard`) pass the check the
orchestrator makes at start-up against the schema that processor publishes.

test_docs_reference.py checks the config tables' keys and defaults (one level below a prefix it
knows); these checks read every page, at any depth, and the examples a reader copies. The truth is
the pydantic models (`Config`, walked through nested models, maps and lists) and, for options, the
processors' `Options` models as `Describe` publishes them (`procmesh._hosted.published_schema`)
checked by `processors/options.bind`. `test_the_checks_catch_made_up_config` feeds the checks a
made-up document.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from procmesh import Processor
from procmesh._hosted import published_schema
from procmesh_orchestrator.config.agents import AgentConfig
from procmesh_orchestrator.config.schema import Config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.processors.options import bind
from tests.unit.doc_pages import Doc, _rel, made_up
from tests.unit.test_docs_builtins import builtin_processors

# -- key paths -------------------------------------------------------------------------------------

State = tuple[str, Any]  # ("model", M) | ("map", value type) | ("list", item type) | ("leaf", type)


def _states(annotation: Any) -> list[State]:
    """What a value of the annotated type may be, unions and Optional unwrapped."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("model", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (dict, typing.Mapping) or getattr(origin, "__name__", "") in ("Mapping", "dict"):
        return [("map", args[1])] if len(args) == 2 else [("leaf", annotation)]
    if origin in (list, tuple) or getattr(origin, "__name__", "") == "Sequence":
        return [("list", args[0])] if args else [("leaf", annotation)]
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [state for arg in args for state in _states(arg)]
    return [("leaf", annotation)]


def _field(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field.annotation
    return None


def unknown_part(path: str) -> str | None:
    """The first part of a dotted key path the schema has no key for (None: the path is one); a
    part after a map (`agents.ID`, `sidecars.NAME`) names an entry, and a number a list item."""
    states: list[State] = [("model", Config)]
    parts = path.split(".")
    for i, part in enumerate(parts):
        following: list[State] = []
        for kind, held in states:
            if kind == "model" and (annotation := _field(held, part)) is not None:
                following += _states(annotation)
            elif kind == "map" or (kind == "list" and part.isdigit()):
                following += _states(held)
        if not following:
            return ".".join(parts[: i + 1])
        states = following
    return None


@functools.cache
def top_keys() -> frozenset[str]:
    return frozenset(k for n, f in Config.model_fields.items() for k in (n, f.alias) if k)


def path_problems(doc: Doc) -> list[str]:
    """Every dotted span path that starts with a top-level config key is a path of the schema."""
    problems = []
    for span in doc.spans:
        for path in re.findall(r"(?<![\w./:-])([a-z][A-Za-z]*(?:\.[A-Za-z_][\w-]*)+)(?![\w/])", span):
            if path.split(".")[0] in top_keys() and (wrong := unknown_part(path)) is not None:
                problems.append(f"{_rel(doc.path)}: `{span[:60]}`: no config key {wrong}")
    return problems


# -- YAML examples -----------------------------------------------------------------------------------

REFUSED = ("extra_forbidden", "literal_error", "enum")
"""The validation errors an example can be held to: a key the schema refuses, a value outside a
key's choices. An example is a fragment (a lane without its sidecars, an agent without a model), so
a missing key or a check across sections is not its fault."""


def _examples(doc: Doc) -> list[tuple[type[BaseModel], dict[str, Any]]]:
    """The YAML blocks that are a config, or an agent's keys, with the model that reads them: at
    least half of a block's keys are the config's top-level keys, or an agent's (so a misspelt key
    leaves the block an example, to be refused)."""
    agent_keys = {k for n, f in AgentConfig.model_fields.items() for k in (n, f.alias) if k}
    found: list[tuple[type[BaseModel], dict[str, Any]]] = []
    for lang, body in doc.blocks:
        data = yaml.safe_load(body) if lang in ("yaml", "yml") else None
        if not isinstance(data, dict) or not data:
            continue
        tops, agents = len(set(data) & top_keys()), len(set(data) & agent_keys)
        if 2 * max(tops, agents) < len(data):
            continue  # mostly another file's keys (a manifest, a kustomization): not a config
        if tops >= agents:
            found.append((Config, {"agents": {}, **data}))
        else:
            found.append((AgentConfig, {"model": "demo", **data}))
    return found


def example_problems(doc: Doc) -> list[str]:
    """Each config example holds no key the schema refuses, and no value outside a key's choices."""
    problems = []
    for model, data in _examples(doc):
        try:
            model.model_validate(data)
        except ValidationError as invalid:
            problems += [
                f"{_rel(doc.path)}: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                for e in invalid.errors()
                if e["type"].startswith(REFUSED)
            ]
    return problems


@functools.cache
def served() -> dict[str, Processor]:
    """The processors this repository serves (the built-ins, the default error processors and the
    examples), by id."""
    from procmesh_sidecars import examples

    return builtin_processors() | {p.id: p for p in examples.processors()}


def _entries(value: Any) -> list[dict[str, Any]]:
    """Every lane entry or workflow step that names a processor and gives options, at any depth."""
    if isinstance(value, list):
        return [entry for item in value for entry in _entries(item)]
    if not isinstance(value, dict):
        return []
    own = [value] if isinstance(value.get("processor"), str) and value.get("options") else []
    return own + [entry for item in value.values() for entry in _entries(item)]


def option_problems(doc: Doc) -> list[str]:
    """A served processor's options in an example pass the start-up check against its schema."""
    problems = []
    for _, data in _examples(doc):
        for entry in _entries(data):
            processor = served().get(entry["processor"].rsplit("/", 1)[-1])
            if processor is None or processor.Options is None:
                continue
            schema = published_schema(processor.Options)
            try:
                bind(processor.id, entry["options"], json.dumps(schema), entry["processor"])
            except ConfigError as refused:
                problems.append(f"{_rel(doc.path)}: {refused}")
    return problems


# -- the tests -------------------------------------------------------------------------------------


def test_config_key_paths_in_the_docs_exist(docs: list[Doc]) -> None:
    assert unknown_part("agents.assistant.memory.semanticRecall.topK") is None  # the walk reaches it
    assert [p for doc in docs for p in path_problems(doc)] == []


def test_config_examples_hold_only_keys_and_values_the_schema_takes(docs: list[Doc]) -> None:
    examples = [e for doc in docs for e in _examples(doc)]
    assert len(examples) > 20  # the pages' examples were found
    assert [p for doc in docs for p in example_problems(doc)] == []


def test_options_in_the_examples_are_the_processors(docs: list[Doc]) -> None:
    entries = [e for doc in docs for _, data in _examples(doc) for e in _entries(data)]
    assert any(e["processor"].endswith("/moderation") for e in entries)
    assert [p for doc in docs for p in option_problems(doc)] == []


def test_the_checks_catch_made_up_config() -> None:
    doc = made_up(
        "`agents.ID.memory.semanticRecall.topK`, `agents.ID.memory.semanticRecal.topK`,"
        " `judgeCache.redis.keyPrefix`, `durable.eventLog.urlEnvv`, `storage.dataDir`.\n\n"
        "```yaml\nsidecars:\n  guards: {address: 'unix:///g.sock', onFailure: fail-opn}\n"
        "agents:\n  a:\n    model: demo\n    maxStep: 3\n"
        "    inputProcessors:\n      - processor: builtins/moderation\n"
        "        options: {model: openai/gpt-5-nano, treshold: 0.4}\n"
        "      - {processor: guards/topic-guard, options: {words: [a]}}\n```\n\n"
        "```yaml\nmaxProcessorRetries: 2\nerrorProcessorDefault: false\n```\n"
    )
    assert path_problems(doc) == [
        "docs/made-up.md: `agents.ID.memory.semanticRecal.topK`: "
        "no config key agents.ID.memory.semanticRecal",
        "docs/made-up.md: `durable.eventLog.urlEnvv`: no config key durable.eventLog.urlEnvv",
    ]
    assert [p.split(": ", 2)[1] for p in example_problems(doc)] == [
        "sidecars.guards.onFailure",
        "agents.a.maxStep",
        "errorProcessorDefault",
    ]
    assert len(option_problems(doc)) == 1
    assert "treshold" in option_problems(doc)[0]
