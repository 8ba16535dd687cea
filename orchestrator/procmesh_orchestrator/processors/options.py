"""A lane entry's processor options: checked against the schema the processor's ``Describe``
published, at start-up and, for those taken from the request context, per run (the seeds'
``new TokenLimiter(requestContext.get('tokenLimit') ?? 4000)``).

A lane entry's option may be ``{fromContext: KEY, default: VALUE}`` instead of a value: each run
gives the processor the request context's ``KEY`` when the run has it, else ``default``; with no
default and no value the option is left out (the processor's own default applies). The options a
run resolves are validated against the schema the processor's ``Describe`` published, before any
hook of the run is called, so a tenant's bad value fails its run with a message naming the
processor, the option and the context key — never a sidecar's INVALID_ARGUMENT half-way.

``{fromContext: KEY, cases: {VALUE: X, ...}, default: D}`` maps the context's value instead: a run
whose ``KEY`` is the string ``VALUE`` gets ``X``, any other run ``D`` (the context's own value is
never the option's), so a limit can follow a key no caller sets, such as ``resourceId`` (the
resource of the caller's API key); each case is checked at start-up like the default.

Only top-level options may come from the context; a value that is an object with other keys than
``fromContext``, ``cases`` and ``default`` is an ordinary option value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from procmesh_orchestrator.errors import ConfigError, RequestContextError

log = logging.getLogger(__name__)

Problem = Callable[[Mapping[str, Any]], "tuple[str, str] | None"]
"""Checks options against a published schema: the first failing path and its message, or None."""

FROM_CONTEXT = "fromContext"
_MISSING = object()


@dataclass(frozen=True)
class ContextOption:
    """One option a run takes from its request context."""

    option: str
    key: str
    default: Any = _MISSING
    cases: Mapping[str, Any] | None = None
    """Values by the context's value (None: the context's value itself)."""

    def value(self, request_context: Mapping[str, Any]) -> Any:
        """The run's value, or `_MISSING` (leave the option out)."""
        if self.cases is None:
            return request_context.get(self.key, self.default)
        found = request_context.get(self.key)
        return self.cases[found] if isinstance(found, str) and found in self.cases else self.default


def split(options: Mapping[str, Any], where: str) -> tuple[dict[str, Any], tuple[ContextOption, ...]]:
    """A lane entry's options as (fixed options, options from the context); ConfigError naming
    ``where.options.NAME`` for a malformed ``fromContext``."""
    fixed: dict[str, Any] = {}
    taken: list[ContextOption] = []
    for name, value in options.items():
        if not (isinstance(value, Mapping) and FROM_CONTEXT in value):
            fixed[name] = value
            continue
        extra = sorted(set(value) - {FROM_CONTEXT, "default", "cases"})
        key, cases = value[FROM_CONTEXT], value.get("cases")
        if extra or not isinstance(key, str) or not key or not isinstance(cases, Mapping | None):
            raise ConfigError(
                f"{where}.options.{name}: an option from the request context is "
                f"{{fromContext: KEY, cases: {{VALUE: OPTION}}, default: OPTION}} with KEY a non-empty "
                "string and cases (optional) a mapping" + (f" (unknown keys {extra})" if extra else "")
            )
        taken.append(ContextOption(name, key, value.get("default", _MISSING), cases))
    return fixed, tuple(taken)


def with_defaults(fixed: Mapping[str, Any], taken: tuple[ContextOption, ...]) -> dict[str, Any]:
    """The options of a run whose request context has none of the keys (what start-up checks)."""
    return resolve(fixed, taken, {})


def resolve(
    fixed: Mapping[str, Any], taken: tuple[ContextOption, ...], request_context: Mapping[str, Any]
) -> dict[str, Any]:
    """The options one run gives the processor."""
    out = dict(fixed)
    for option in taken:
        value = option.value(request_context)
        if value is not _MISSING:
            out[option.option] = value
    return out


def check_run_options(
    processor: str,
    taken: tuple[ContextOption, ...],
    options: Mapping[str, Any],
    problem: Problem | None,
) -> None:
    """RequestContextError naming the processor, the option and its context key when the
    published schema refuses the run's options (`problem` gives the failing option's path and the
    schema's message)."""
    if problem is None:
        return
    found = problem(options)
    if found is None:
        return
    path, message = found
    top = path.split(".", 1)[0]
    source = next((o for o in taken if o.option == top), None)
    origin = f" (request-context key {source.key!r})" if source is not None else ""
    raise RequestContextError(
        f"processor {processor!r}: option {path or '(options)'}{origin}: {message}",
        keys=[source.key] if source is not None else [],
    )


@dataclass(frozen=True)
class BoundOptions:
    """A lane entry's options as bound at start-up."""

    static: dict[str, Any]
    """What a run gets whose request context has none of the keys (every context option at its
    default): the options of a run when `taken` is empty."""
    fixed: dict[str, Any]
    """The options that are the same for every run."""
    taken: tuple[ContextOption, ...]
    problem: Problem | None
    """The published schema's check (None: the processor published none, or an unusable one)."""


def bind(processor: str, options: Mapping[str, Any], schema_json: str, where: str) -> BoundOptions:
    """Split a lane entry's options and check them, every context option at its default, against
    the schema the processor published: ConfigError naming ``where.options.PATH`` otherwise."""
    fixed, taken = split(options, where)
    problem = schema_problem(processor, schema_json)
    static = with_defaults(fixed, taken)
    # the options of a run with no key, then of a run in each case (naming the case's path)
    runs: list[tuple[dict[str, Any], str]] = [({}, "")] + [
        ({o.key: case}, f"{o.option}.cases.{case}") for o in taken for case in (o.cases or {})
    ]
    for request_context, case in runs:
        found = problem(resolve(fixed, taken, request_context)) if problem is not None else None
        if found is not None:
            path, message = found
            at = case if case and path.split(".", 1)[0] == case.split(".", 1)[0] else path
            raise ConfigError(
                f"{where}.options{'.' + at if at else ''}: {message} "
                f"(schema published by processor {processor!r})"
            )
    return BoundOptions(static, fixed, taken, problem)


def schema_problem(processor: str, schema_json: str) -> Problem | None:
    """The check of options against a published JSON schema (None when there is none; an
    unusable one is logged and not applied)."""
    if not schema_json:
        return None
    try:
        validator = jsonschema.Draft202012Validator(json.loads(schema_json))
        validator.check_schema(validator.schema)
    except (ValueError, jsonschema.SchemaError) as exc:
        log.warning("processor %s publishes an unusable options schema: %s", processor, exc)
        return None

    def problem(options: Mapping[str, Any]) -> tuple[str, str] | None:
        errors = sorted(validator.iter_errors(dict(options)), key=str)
        if not errors:
            return None
        return ".".join(str(p) for p in errors[0].absolute_path), errors[0].message

    return problem
