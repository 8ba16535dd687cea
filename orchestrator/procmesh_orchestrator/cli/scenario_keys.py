"""The keys a conformance scenario may hold (FORMAT.md), checked before anything runs.

A key this runner does not know would otherwise be ignored and the scenario run as if it were
absent: a wrong trace with exit 0, the worst way to fail a conformance check. So every object of
the format is checked against the keys FORMAT.md gives it, and an unknown one is a
`ScenarioError` naming its path (``agent.stopWhenn``), down to each RESPONSE of ``model`` (the
config's `ScriptedResponse`), each RULE, COND and ACTION of a PROCESSOR (the scripted sidecar
reads only the keys it knows, and judges a COND only once its rule is reached: a misspelt
``then`` for ``do`` would make a rule do nothing) and the values that choose a path
(``method``, an input message's ``role``).

The values of a PROCESSOR, a COND and an ACTION are checked against the types FORMAT.md gives
them too: the scripted sidecar compares them as given, so ``"stepNumber": "1"`` would never hold,
``"drop": false`` would drop the part (the reference's runner does not) and
``"processDataParts": "false"`` would be true; each is a `ScenarioError` naming its path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from procmesh import hooks
from procmesh_orchestrator.config.providers import ScriptedResponse
from procmesh_orchestrator.errors import ScenarioError
from procmesh_orchestrator.run import stop

LANES = ("inputProcessors", "outputProcessors", "errorProcessors")
CONTEXT_LANES = ("inputProcessorsByContext", "outputProcessorsByContext")

_TOP = {"name", "description", "divergesFromReference", "agent", "model", "tools", "call", "calls"}
_AGENT = {
    "instructions",
    "maxSteps",
    "maxProcessorRetries",
    "errorProcessorDefaults",
    "stopWhen",
    "memory",
    *LANES,
    *CONTEXT_LANES,
}
_CALL = {"method", "input", "options"}
_OPTIONS = {"maxSteps", "maxProcessorRetries", "stopWhen", "requestContext", "memory", *LANES}
_HOOKS = {h.rpc[0].lower() + h.rpc[1:] for h in hooks.HOOKS if h.name != "execute_tool"}
_PROCESSOR = {"id", "processDataParts", "onViolation", "speculative", *_HOOKS}
_RULE = {"when", "do"}
_COND = {
    "textContains",
    "textMatches",
    "stepNumber",
    "stepNumberGte",
    "retryCountLt",
    "partType",
    "stateGte",
    "errorStatus",
}
_ACTIONS: dict[str, set[str] | None] = {
    "abort": {"reason", "retry", "metadata"},
    "replaceText": {"pattern", "with"},
    "signal": {"contents", "attributes", "transient"},
    "custom": {"type", "data", "dataFromState"},
    "drop": None,
    "toolChoice": None,
    "systemMessage": None,
    "count": None,
    "metadata": None,
    "retry": None,
    "setResult": None,
}
"""Each ACTION's one key, and the keys of its object (None: a value, not an object of keys)."""
_Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_regex(value: Any) -> bool:
    try:
        re.compile(value)
    except (re.error, TypeError):
        return False
    return isinstance(value, str)


_COND_VALUES: dict[str, tuple[_Check, str]] = {
    "textContains": (_is_str, "a string"),
    "textMatches": (_is_regex, "a regular expression (a string)"),
    "stepNumber": (_is_int, "an integer"),
    "stepNumberGte": (_is_int, "an integer"),
    "retryCountLt": (_is_int, "an integer"),
    "partType": (_is_str, "a string"),
    "errorStatus": (_is_int, "an integer"),
}
"""Each COND's value (``stateGte`` is an object, checked on its own)."""
_TOOL_CHOICES = ("auto", "none", "required")
_ACTION_VALUES: dict[str, tuple[_Check, str]] = {
    "drop": (lambda v: v is True, "true"),
    "retry": (lambda v: v is True, "true"),
    "count": (lambda v: isinstance(v, str) and bool(v), "a state key (a non-empty string)"),
    "systemMessage": (_is_str, "a string"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "toolChoice": (
        lambda v: (
            v in _TOOL_CHOICES
            or (
                isinstance(v, dict)
                and set(v) == {"type", "toolName"}
                and v["type"] == "tool"
                and _is_str(v["toolName"])
            )
        ),
        f"{' | '.join(_TOOL_CHOICES)} or {{type: tool, toolName}}",
    ),
}
"""The value of each ACTION that is a value, not an object (``setResult`` takes any)."""
_ACTION_FIELDS: dict[str, dict[str, tuple[_Check, str]]] = {
    "abort": {
        "reason": (_is_str, "a string"),
        "retry": (lambda v: isinstance(v, bool), "a boolean"),
        "metadata": (lambda v: isinstance(v, dict), "an object"),
    },
    "replaceText": {"pattern": (_is_regex, "a regular expression (a string)"), "with": (_is_str, "a string")},
    "signal": {
        "contents": (_is_str, "a string"),
        "attributes": (lambda v: isinstance(v, dict), "an object"),
        "transient": (lambda v: isinstance(v, bool), "a boolean"),
    },
    "custom": {
        "type": (lambda v: isinstance(v, str) and v.startswith("data-"), "a data-* chunk type"),
        "dataFromState": (lambda v: isinstance(v, str) and bool(v), "a state key (a non-empty string)"),
    },
}
"""The fields of each ACTION that is an object (``custom.data`` and ``abort.metadata``'s content:
any JSON)."""
_ACTION_REQUIRED = {"replaceText": ("pattern", "with"), "signal": ("contents",), "custom": ("type",)}
_PROCESSOR_FLAGS = ("processDataParts", "onViolation", "speculative")
_METHODS = ("generate", "stream")
_ROLES = ("user", "assistant", "system")
_BY_CONTEXT = {"key", "cases", "default"}
_TOOL = {"description", "result", "custom"}


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _keys(value: Any, allowed: set[str], where: str) -> dict[str, Any]:
    obj = _object(value, where)
    unknown = sorted(set(obj) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ScenarioError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(prefix + k for k in unknown)} "
            f"(known here: {', '.join(sorted(allowed))})"
        )
    return obj


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _value(value: Any, check: tuple[_Check, str], where: str) -> None:
    """A `ScenarioError` naming `where` when `value` is not what FORMAT.md says it is."""
    ok, what = check
    if not ok(value):
        raise ScenarioError(f"{where}: {what}, got {json.dumps(value)[:80]}")


def _processors(value: Any, where: str) -> None:
    for i, spec in enumerate(_list(value, where)):
        processor = _keys(spec, _PROCESSOR, f"{where}.{i}")
        _value(
            processor.get("id"),
            (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
            f"{where}.{i}.id",
        )
        for flag in _PROCESSOR_FLAGS:
            if flag in processor:
                _value(processor[flag], (lambda v: isinstance(v, bool), "a boolean"), f"{where}.{i}.{flag}")
        for hook in sorted(_HOOKS & set(processor)):
            for j, rule in enumerate(_list(processor[hook], f"{where}.{i}.{hook}")):
                _rule(rule, f"{where}.{i}.{hook}.{j}")


def _rule(value: Any, where: str) -> None:
    rule = _keys(value, _RULE, where)
    when = _keys(rule.get("when") or {}, _COND, f"{where}.when")
    for key in sorted(set(when) & set(_COND_VALUES)):
        _value(when[key], _COND_VALUES[key], f"{where}.when.{key}")
    if "stateGte" in when:
        gte = _keys(when["stateGte"], {"key", "value"}, f"{where}.when.stateGte")
        _value(gte.get("key"), (_is_str, "a state key (a string)"), f"{where}.when.stateGte.key")
        _value(gte.get("value"), (_is_int, "an integer"), f"{where}.when.stateGte.value")
    for k, action in enumerate(_list(rule.get("do") or [], f"{where}.do")):
        at = f"{where}.do.{k}"
        names = sorted(_object(action, at))
        if len(names) != 1 or names[0] not in _ACTIONS:
            raise ScenarioError(
                f"{at}: an action is one of {', '.join(sorted(_ACTIONS))}, got {', '.join(names) or 'none'}"
            )
        name = names[0]
        inner = _ACTIONS[name]
        if inner is None:
            if name in _ACTION_VALUES:
                _value(action[name], _ACTION_VALUES[name], f"{at}.{name}")
            continue
        fields = _keys(action[name], inner, f"{at}.{name}")
        for field in _ACTION_REQUIRED.get(name, ()):
            if field not in fields:
                raise ScenarioError(f"{at}.{name}.{field}: required")
        for field, check in _ACTION_FIELDS[name].items():
            if field in fields:
                _value(fields[field], check, f"{at}.{name}.{field}")
        if name == "custom" and ("data" in fields) == ("dataFromState" in fields):
            raise ScenarioError(f"{at}.custom: give data or dataFromState (one of them)")


def _responses(value: Any) -> None:
    """Each RESPONSE of ``model`` as the scripted model takes it (`ScriptedResponse`)."""
    for i, response in enumerate(_list(value, "model")):
        try:
            ScriptedResponse.model_validate(response)
        except ValidationError as exc:
            err = exc.errors()[0]
            path = ".".join(str(p) for p in (i, *err["loc"]))
            raise ScenarioError(f"model.{path}: {err['msg']}") from None


def _call(call: Any, where: str) -> dict[str, Any]:
    checked = _keys(call, _CALL, where)
    if checked.get("method", "generate") not in _METHODS:
        raise ScenarioError(f"{where}.method: {' or '.join(_METHODS)}, got {checked['method']!r}")
    given = checked.get("input")
    if not isinstance(given, str):
        for i, message in enumerate(_list(given, f"{where}.input")):
            msg = _keys(message, {"role", "text"}, f"{where}.input.{i}")
            if msg.get("role") not in _ROLES or not isinstance(msg.get("text"), str):
                raise ScenarioError(f"{where}.input.{i}: {{role: {' | '.join(_ROLES)}, text: a string}}")
    return checked


def _lanes(source: dict[str, Any], where: str, *, by_context: bool) -> None:
    if "stopWhen" in source:
        try:
            stop.parse(source["stopWhen"], f"{where}.stopWhen")
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    for lane in LANES:
        if lane in source:
            _processors(source[lane], f"{where}.{lane}")
    for lane in CONTEXT_LANES if by_context else ():
        if lane not in source:
            continue
        static = lane.removesuffix("ByContext")
        if static in source:
            raise ScenarioError(f"{where}: give {static} or {lane}, not both")
        chosen = _keys(source[lane], _BY_CONTEXT, f"{where}.{lane}")
        if not isinstance(chosen.get("key"), str) or not chosen["key"]:
            raise ScenarioError(f"{where}.{lane}.key: the request-context key, a non-empty string")
        for name, specs in _object(chosen.get("cases", {}), f"{where}.{lane}.cases").items():
            _processors(specs, f"{where}.{lane}.cases.{name}")
        _processors(chosen.get("default", []), f"{where}.{lane}.default")


def check(scenario: dict[str, Any]) -> None:
    """Refuse any key FORMAT.md does not give its object, naming its path."""
    _keys(scenario, _TOP, "")
    _responses(scenario.get("model", []))
    agent = _keys(scenario.get("agent", {}), _AGENT, "agent")
    _lanes(agent, "agent", by_context=True)
    if "memory" in agent:
        _keys(agent["memory"], {"lastMessages"}, "agent.memory")
    for name, tool in _object(scenario.get("tools", {}), "tools").items():
        if "custom" in _keys(tool, _TOOL, f"tools.{name}"):
            _keys(tool["custom"], {"type", "data"}, f"tools.{name}.custom")
    calls = (
        [(f"calls.{i}", c) for i, c in enumerate(_list(scenario["calls"], "calls"))]
        if "calls" in scenario
        else [("call", scenario["call"])]
    )
    for where, call in calls:
        options = _keys(_call(call, where).get("options", {}), _OPTIONS, f"{where}.options")
        _lanes(options, f"{where}.options", by_context=False)
        if "memory" in options:
            memory = _keys(options["memory"], {"thread", "resource"}, f"{where}.options.memory")
            if not all(isinstance(v, str) for v in memory.values()):
                raise ScenarioError(f"{where}.options.memory: thread and resource are strings")
        context = _object(options.get("requestContext", {}), f"{where}.options.requestContext")
        if not all(isinstance(v, str) for v in context.values()):
            raise ScenarioError(f"{where}.options.requestContext: an object of string values")


def lane_specs(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The processor specs of an agent's or a call's lanes, every case and default of a lane
    chosen from the request context included."""
    out = [spec for lane in LANES for spec in source.get(lane) or []]
    for lane in CONTEXT_LANES:
        chosen = source.get(lane) or {}
        for specs in (*(chosen.get("cases") or {}).values(), chosen.get("default") or []):
            out.extend(specs)
    return out
