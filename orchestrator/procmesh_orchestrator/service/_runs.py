"""Run control both APIs share: the runs streaming on this replica (cancel), resuming a suspended
run for its approval, and listing suspended runs, each within the caller's resource."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import MemoryStoreError, SuspendError
from procmesh_orchestrator.memory.store import SUSPENDED, SuspendedRun
from procmesh_orchestrator.run import Agent, CallOptions, RunResult, RunStream
from procmesh_orchestrator.service._calls import Decision
from procmesh_orchestrator.service._errors import ResumeRefusedError, SuspendedRunGoneError, resume_error

if TYPE_CHECKING:
    from procmesh_orchestrator.service._service import Service


@dataclass
class ActiveRun:
    """A run streaming on this replica."""

    agent_id: str
    run: RunStream
    owner: str
    """The resource the run is for ("" when none): a key bound to another cannot cancel it."""


class ActiveRuns:
    """The streamed runs in flight on this replica, by run id (from their ``start`` chunk)."""

    def __init__(self) -> None:
        self._runs: dict[str, ActiveRun] = {}

    def add(self, run_id: str, entry: ActiveRun) -> None:
        """Register a run once its id is known."""
        if run_id:
            self._runs[run_id] = entry

    def discard(self, run_id: str) -> None:
        """Forget a run that ended (no error when it is unknown)."""
        self._runs.pop(run_id, None)

    def find(self, agent_id: str, run_id: str, bound_resource: str | None) -> ActiveRun | None:
        """The agent's run by this id, when the caller may act on it."""
        entry = self._runs.get(run_id)
        if entry is None or entry.agent_id != agent_id:
            return None
        if bound_resource and entry.owner != bound_resource:
            return None
        return entry

    def __len__(self) -> int:
        return len(self._runs)


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Store errors of resuming and listing as the APIs' answers (404, 409, 400, 503); a snapshot
    this orchestrator cannot resume (a processor list naming what it lacks) is a 409, the run
    still suspended."""
    try:
        yield
    except MemoryStoreError as exc:
        raise resume_error(exc) from None
    except SuspendError as exc:
        raise ResumeRefusedError(str(exc)) from None


async def check_owner(service: Service, agent: Agent, decision: Decision, bound: str | None) -> None:
    """A key bound to a resource resumes only that resource's runs: another's is answered as
    missing (404). The store has no read of one run, so this claims and releases it; a concurrent
    resume in that instant sees a conflict, as it would a moment later."""
    if not bound or agent.spec.store is None:
        return
    with store_errors():
        store = await agent.spec.store()
        saved = await store.claim_suspended(decision.run_id, decision.tool_call_id)
        await store.release_suspended(decision.run_id)
    if saved.resource_id != bound or saved.agent_id != agent.spec.id:
        raise SuspendedRunGoneError(f"no suspended run {decision.run_id!r} awaits this tool call")


def resume_options(decision: Decision) -> CallOptions:
    """The resuming call's options: its request context (the rest is the snapshot's)."""
    return CallOptions(request_context=decision.request_context, abort_signal=asyncio.Event())


async def resume_stream(
    service: Service, agent: Agent, decision: Decision, *, approved: bool, bound: str | None
) -> RunStream:
    """Claim the suspended run and go on, streamed (404 / 409 as `store_errors`)."""
    await check_owner(service, agent, decision, bound)
    with store_errors():
        return await agent.resume_stream(
            decision.run_id,
            decision.tool_call_id,
            approved=approved,
            reason=decision.reason,
            options=resume_options(decision),
        )


async def resume_generate(
    service: Service, agent: Agent, decision: Decision, *, approved: bool, bound: str | None
) -> RunResult:
    """Claim the suspended run and run it to its end (404 / 409 before it starts; a failed run
    raises as `Agent.generate` does)."""
    await check_owner(service, agent, decision, bound)
    options = CallOptions(request_context=decision.request_context)
    try:
        if approved:
            return await agent.approve_tool_call(decision.run_id, decision.tool_call_id, options)
        return await agent.decline_tool_call(decision.run_id, decision.tool_call_id, decision.reason, options)
    except (MemoryStoreError, SuspendError) as exc:
        if getattr(exc, "result", None) is not None:
            raise  # the run started and failed on its store: a failed run, not a refused request
        with store_errors():
            raise


def suspended_run_json(saved: SuspendedRun) -> dict[str, Any]:
    """A suspended run as ``GET /api/agents/{id}/suspended-runs`` lists it."""
    pending = (saved.snapshot.get("pending") or {}).get("calls") or []
    waiting = set(saved.tool_call_ids)
    out: dict[str, Any] = {
        "runId": saved.run_id,
        "status": "suspended" if saved.status == SUSPENDED else "resuming",
        "suspendedAt": saved.created_at,
        "toolCalls": [
            {
                "toolCallId": call.get("toolCallId"),
                "toolName": call.get("toolName"),
                "args": call.get("args"),
                "requiresApproval": True,
            }
            for call in pending
            if call.get("toolCallId") in waiting
        ],
    }
    if saved.thread_id:
        out["threadId"] = saved.thread_id
    if saved.resource_id:
        out["resourceId"] = saved.resource_id
    return out
