"""The keys a conformance scenario may hold (FORMAT.md), checked before anything runs.

A key this runner does not know would otherwise be ignored and the scenario run as if it were
absent: a wrong trace with exit 0, the worst way to fail a conformance check. So every object of
the format is checked against the keys FORMAT.md gives it, and an unknown one is a
`ScenarioError` naming its path (``agent.stopWhenn``). RULE, COND and ACTION are the scripted
sidecar's to read (it refuses what it does not know); the runner checks everything around them.
"""

from __future__ import annotations

from typing import Any

from procmesh import hooks
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
_PROCESSOR = {
    "id",
    "processDataParts",
    "onViolation",
    "speculative",
    *(h.rpc[0].lower() + h.rpc[1:] for h in hooks.HOOKS if h.name != "execute_tool"),
}
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


def _processors(value: Any, where: str) -> None:
    for i, spec in enumerate(_list(value, where)):
        _keys(spec, _PROCESSOR, f"{where}.{i}")


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
    agent = _keys(scenario.get("agent", {}), _AGENT, "agent")
    _lanes(agent, "agent", by_context=True)
    if "memory" in agent:
        _keys(agent["memory"], {"lastMessages"}, "agent.memory")
    for name, tool in _object(scenario.get("tools", {}), "tools").items():
        _keys(tool, _TOOL, f"tools.{name}")
    calls = (
        [(f"calls.{i}", c) for i, c in enumerate(_list(scenario["calls"], "calls"))]
        if "calls" in scenario
        else [("call", scenario["call"])]
    )
    for where, call in calls:
        options = _keys(_keys(call, _CALL, where).get("options", {}), _OPTIONS, f"{where}.options")
        _lanes(options, f"{where}.options", by_context=False)
        if "memory" in options:
            _keys(options["memory"], {"thread", "resource"}, f"{where}.options.memory")


def lane_specs(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The processor specs of an agent's or a call's lanes, every case and default of a lane
    chosen from the request context included."""
    out = [spec for lane in LANES for spec in source.get(lane) or []]
    for lane in CONTEXT_LANES:
        chosen = source.get(lane) or {}
        for specs in (*(chosen.get("cases") or {}).values(), chosen.get("default") or []):
            out.extend(specs)
    return out
