"""A run's decision record as the APIs read it (issue 31): a tenant key reads its own resource's
runs' records only, another's answers as none does (404), as a durable run's does; every run's
decisions in a time range are an operator's to read."""

from __future__ import annotations

from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, DecisionRecordGoneError, ForbiddenError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.durable import check_run_id, durable_errors, store_of
from procmesh_orchestrator.store import MAX_PAGE, Decision, DecisionStore

MAX_BETWEEN = MAX_PAGE - 1
"""The most decisions one read by time gives: one fewer than the store reads at once, so that
one more is read to tell whether the range holds more (`between_page`)."""


async def run_decisions(service: ServiceCore, run_id: str, caller: Caller) -> list[Decision]:
    """The run's decisions in order, when the caller may see the run: 404 for none and for
    another resource's."""
    run_id = check_run_id(run_id)
    store = await store_of(service.app)
    with durable_errors():
        decisions = await store.run_decisions(run_id)
    if not decisions or not caller.may_see(decisions[0].resource_id):
        raise DecisionRecordGoneError(f"no decision record of run {run_id[:64]!r}")
    return decisions


async def between_page(
    store: DecisionStore, since: str, until: str, agent_id: str | None, limit: int
) -> tuple[list[Decision], bool]:
    """The first `limit` (at most `MAX_BETWEEN`) decisions from `since` to before `until`, oldest
    first, and whether the range holds more: a read cut at its limit says so, never silently."""
    found = await store.decisions_between(since, until, agent_id=agent_id, limit=limit + 1)
    return found[:limit], len(found) > limit


async def decisions_between(
    service: ServiceCore, caller: Caller, since: str | None, until: str, agent_id: str | None, limit: int
) -> tuple[list[Decision], bool]:
    """Every run's decisions from `since` to before `until` (ISO 8601), oldest first, at most
    `limit`, and whether the range holds more (`between_page`): operators only (they are every
    tenant's)."""
    if not caller.operator:
        raise ForbiddenError("decisions by time are every tenant's: an operator key only")
    if not since:
        raise BadRequestError("since: required (ISO 8601)")
    if not 1 <= limit <= MAX_BETWEEN:
        raise BadRequestError(f"limit: must be an integer from 1 to {MAX_BETWEEN}")
    store = await store_of(service.app)
    with durable_errors():
        return await between_page(store, since, until, agent_id, limit)
