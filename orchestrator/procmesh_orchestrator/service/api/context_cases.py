"""The request-context keys an agent chooses a case by, and a call's values that choose none.

A lane chosen from the request context (``inputProcessorsByContext``), a processor option's or a
cost limit's ``cases`` take the case named by the context's value, and the default when the key
is missing or names no case, as the reference's runner does (a value that is not a string names
none there either: ``typeof value === 'string'``). A value that is not a string is then most
likely the caller's mistake (``tier: 2`` for ``"2"``): the run goes on with the default, as the
reference's would, and the call's warnings name the key (``requestContext.KEY``), with a log
line and ``procmesh_call_settings_ignored_total{setting="requestContext"}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from procmesh_orchestrator.processors.lanes import handles_in
from procmesh_orchestrator.run.types import AgentSpec

NOT_A_STRING = "not a string: it names no case of the agent's config, so the default applies"


def case_keys(spec: AgentSpec) -> frozenset[str]:
    """The request-context keys the agent's config picks a case by."""
    return frozenset(_keys(spec))


def _keys(spec: AgentSpec) -> Iterator[str]:
    lanes = spec.lanes
    for chosen in (lanes.input_by_context, lanes.output_by_context):
        if chosen is not None:
            yield chosen.key
    entries = [*lanes.every(), *lanes.error]
    for handle in handles_in(entries):
        yield from (o.key for o in handle.context_options if o.cases is not None)
    if spec.cost is not None:
        for setting in (spec.cost.config.max_cost, spec.cost.config.scope):
            if getattr(setting, "cases", None) is not None:
                yield setting.from_context  # type: ignore[union-attr]


def uncased(keys: frozenset[str], request_context: Mapping[str, Any]) -> list[str]:
    """The keys among `keys` the context gives a value that is not a string, sorted."""
    return sorted(k for k in keys if k in request_context and not isinstance(request_context[k], str))
