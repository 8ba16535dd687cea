"""The conditions a lane entry's or a workflow conditional's ``when`` may state.

Conditions on the request context are decided once per run. Conditions on the call (the last
user message, the step number, the retry count: what the seeds' conditional branches read from a
step's input) are decided at each hook call; one of them in a `when` makes the whole `when`
decided there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

OPERATORS = ("equals", "in", "present", "matches")
"""What a condition on a request-context key may test (one per condition)."""

CALL_KEYS = ("message", "stepNumber", "retryCount")
"""What a condition decided at each call tests: ``{message: {matches: REGEX}}``, ``{stepNumber:
{OP: N}}``, ``{retryCount: {OP: N}}``."""

NUMBER_OPERATORS = ("equals", "gte", "lt")
"""What a condition on the step number or the retry count may test (one per condition)."""


class Call(NamedTuple):
    """What a hook call shows a condition decided at each call."""

    text: str | None
    """The last user message's text (None: the call has none, a message condition fails)."""
    step_number: int
    retry_count: int


def _condition(value: Any, where: str) -> dict[str, Any]:
    """One ``{key: K, OPERATOR: V}``, checked (ValueError naming the problem)."""
    unknown = sorted(set(value) - {"key", *OPERATORS})
    if unknown:
        raise ValueError(
            f"{where}: unknown condition key(s) {', '.join(map(repr, unknown))} (a condition is "
            f"{{key: NAME, OP: VALUE}} with OP one of {', '.join(OPERATORS)})"
        )
    key = value.get("key")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: the request-context key, a non-empty string")
    ops = [op for op in OPERATORS if op in value]
    if len(ops) != 1:
        raise ValueError(f"{where}: give exactly one of {', '.join(OPERATORS)} (got {ops or 'none'})")
    op, arg = ops[0], value[ops[0]]
    if op == "in" and not isinstance(arg, list):
        raise ValueError(f"{where}.in: a list of the values that pass")
    if op == "present" and not isinstance(arg, bool):
        raise ValueError(f"{where}.present: true (the key is there) or false (it is not)")
    if op == "matches":
        if not isinstance(arg, str):
            raise ValueError(f"{where}.matches: a regular expression (a string)")
        try:
            re.compile(arg)
        except re.error as exc:
            raise ValueError(f"{where}.matches: not a regular expression: {exc}") from None
    return dict(value)


def _call_key(value: Any) -> str | None:
    """The key of a condition decided at each call (`CALL_KEYS`), else None."""
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        if key in CALL_KEYS and isinstance(value[key], dict):
            return str(key)
    return None


def _call_condition(value: dict[str, Any], key: str, where: str) -> None:
    """One condition decided at each call, checked (ValueError naming the problem)."""
    spec = value[key]
    if key == "message":
        if set(spec) != {"matches"} or not isinstance(spec["matches"], str):
            raise ValueError(
                f"{where}.message: {{matches: REGEX}}, a regular expression searched in the text of "
                f"the last user message (got keys {sorted(spec)})"
            )
        try:
            re.compile(spec["matches"])
        except re.error as exc:
            raise ValueError(f"{where}.message.matches: not a regular expression: {exc}") from None
        return
    number = next(iter(spec.values()), None) if len(spec) == 1 else None
    if set(spec) - set(NUMBER_OPERATORS) or not isinstance(number, int) or isinstance(number, bool):
        raise ValueError(
            f"{where}.{key}: {{OP: N}} with OP one of {', '.join(NUMBER_OPERATORS)} and N a whole "
            f"number (got {spec!r})"
        )


def check_when(value: Any) -> Any:
    """A ``when``: a condition ``{key, equals|in|present|matches}`` or one decided at each call
    (`CALL_KEYS`), a list of them (all hold), or a map of keys to the values they must equal
    (``{tier: gold}``); ValueError naming the problem."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            key = _call_key(item)
            if key is not None:
                _call_condition(item, key, f"when.{i}")
                continue
            if not isinstance(item, dict) or "key" not in item:
                raise ValueError(
                    f"when.{i}: a condition {{key: NAME, OP: VALUE}} or on the call "
                    "({message|stepNumber|retryCount: ...})"
                )
            _condition(item, f"when.{i}")
        return value
    if not isinstance(value, dict):
        raise ValueError("when: a condition {key: NAME, OP: VALUE}, a list of them, or {KEY: VALUE}")
    key = _call_key(value)
    if key is not None:
        _call_condition(value, key, "when")
    elif "key" in value:
        _condition(value, "when")
    return value


def decided_per_call(when: Any) -> bool:
    """Whether a checked `when` holds a condition on the call (`CALL_KEYS`): then the whole `when`
    is decided at each hook call, not once per run."""
    items = when if isinstance(when, list) else [when]
    return any(_call_key(c) is not None for c in items)


def _number_holds(spec: dict[str, int], value: int) -> bool:
    ((op, n),) = spec.items()
    return value == n if op == "equals" else value >= n if op == "gte" else value < n


def when_holds(when: Any, request_context: Mapping[str, Any], call: Call | None = None) -> bool:
    """Whether a checked `when` (`check_when`) holds for this request context and, for a
    condition on the call, this `call` (None outside a call: such a condition fails)."""
    if isinstance(when, list):
        return all(when_holds(c, request_context, call) for c in when)
    key = _call_key(when)
    if key is not None:
        if call is None:
            return False
        if key == "message":
            return call.text is not None and re.search(when["message"]["matches"], call.text) is not None
        return _number_holds(when[key], call.step_number if key == "stepNumber" else call.retry_count)
    if "key" not in when:
        return all(request_context.get(k) == v for k, v in when.items())
    key = when["key"]
    if "present" in when:
        return bool((key in request_context) == when["present"])
    if key not in request_context:
        return False
    value = request_context[key]
    if "equals" in when:
        return bool(value == when["equals"])
    if "in" in when:
        return value in when["in"]
    return isinstance(value, str) and re.fullmatch(when["matches"], value) is not None
