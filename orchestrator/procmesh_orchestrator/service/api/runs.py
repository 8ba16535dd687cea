"""The run registry and run control both APIs share: the run gate (runs in flight, refused while
draining), the runs streaming on this replica (cancel), resuming a suspended run for its approval,
and listing suspended runs, each within the caller's resource.

A tenant key (bound to a resource) sees and acts on that resource's runs only, and another's run is
answered exactly as one that does not exist (same status, same words); an operator key (or any
caller when no key is configured) on every resource's. A conflict on the caller's own run (already
decided, being resumed) stays a 409."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from procmesh_orchestrator.errors import (
    MemoryStoreError,
    RequestContextError,
    ResumeMismatchError,
    SuspendError,
)
from procmesh_orchestrator.run import Agent, CallOptions, RunResult, RunStream
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    DrainingError,
    ResumeAnswerError,
    ResumeRefusedError,
    resume_error,
)
from procmesh_orchestrator.service.api.resume import ResumeRequest
from procmesh_orchestrator.store import SUSPENDED, SuspendedRun

GateState = Literal["open", "draining"]


class RunGate:
    """Counts in-flight runs and refuses new ones once draining (SIGTERM)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.state: GateState = "open"

    @property
    def active(self) -> int:
        """Runs in flight."""
        return self._active

    @property
    def draining(self) -> bool:
        """True once `drain()` was called."""
        return self.state == "draining"

    def enter(self) -> None:
        """Admit a run (raises DrainingError when draining); pair with `leave()`."""
        if self.draining:
            raise DrainingError("the server is shutting down and takes no new runs; retry on another replica")
        self._active += 1
        self._idle.clear()

    def leave(self) -> None:
        """A run ended."""
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    def drain(self) -> None:
        """Refuse new runs from now on."""
        self.state = "draining"

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no run is in flight; False when `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


@dataclass
class ActiveRun:
    """A run streaming on this replica."""

    agent_id: str
    run: RunStream
    owner: str
    """The resource the run is for ("" when none): only its tenant's keys and operators cancel it."""


class ActiveRuns:
    """The streamed runs in flight on this replica, by run id (from their ``start`` chunk)."""

    def __init__(self) -> None:
        self._runs: dict[str, ActiveRun] = {}
        self._reserved: set[str] = set()
        """Run ids callers chose, held from admission to the run's end (`reserve`)."""

    def reserve(self, run_id: str) -> bool:
        """Hold a caller-chosen run id for its call; False when a run here has it or holds it."""
        if run_id in self._runs or run_id in self._reserved:
            return False
        self._reserved.add(run_id)
        return True

    def add(self, run_id: str, entry: ActiveRun) -> None:
        """Register a run once its id is known."""
        if run_id:
            self._runs[run_id] = entry

    def discard(self, run_id: str) -> None:
        """Forget a run that ended, its id free again (no error when it is unknown)."""
        self._runs.pop(run_id, None)
        self._reserved.discard(run_id)

    def find(self, agent_id: str, run_id: str, caller: Caller) -> ActiveRun | None:
        """The agent's run by this id, when the caller may act on it (None otherwise, as for none)."""
        entry = self._runs.get(run_id)
        if entry is None or entry.agent_id != agent_id or not caller.may_see(entry.owner):
            return None
        return entry

    def __len__(self) -> int:
        return len(self._runs)


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Store errors of resuming and listing as the APIs' answers (404, 409, 400, 503); a snapshot
    this orchestrator cannot resume (a processor list naming what it lacks) is a 409, the run
    still suspended; so is a request context the agent's requestContextSchema refuses (a 400)."""
    try:
        yield
    except RequestContextError as exc:
        raise BadRequestError(str(exc)) from None
    except MemoryStoreError as exc:
        raise resume_error(exc) from None
    except ResumeMismatchError as exc:
        raise ResumeAnswerError(str(exc)) from None
    except SuspendError as exc:
        raise ResumeRefusedError(str(exc)) from None


def resume_options(request: ResumeRequest) -> CallOptions:
    """The resuming call's options: its request context (the rest is the snapshot's)."""
    return CallOptions(request_context=request.request_context, abort_signal=asyncio.Event())


def run_owner(run: RunStream, caller: Caller) -> str:
    """Whose a resumed streamed run is (its cancel route's check): the snapshot's resource, which a
    tenant's claim already matched to its key's."""
    return run.resource_id if not caller.resource else caller.resource


def claim_scope(caller: Caller) -> str | None:
    """The resource a resume's claim is limited to: a tenant key's (the store answers another's
    run as a missing one, in the statement that claims it); None for an operator."""
    return None if caller.operator else (caller.resource or "")


async def resume_stream(agent: Agent, request: ResumeRequest, *, approved: bool, caller: Caller) -> RunStream:
    """Claim the suspended run and go on, streamed (404 / 409 as `store_errors`): with the
    request's resume data when it has some (resume-stream), else approved or declined."""
    decision: dict[str, Any] = (
        {"approved": approved, "reason": request.reason}
        if request.data is None
        else {"resume_data": request.data.data}
    )
    with store_errors():
        return await agent.resume_stream(
            request.run_id,
            request.tool_call_id,
            options=resume_options(request),
            resource_id=claim_scope(caller),
            **decision,
        )


async def resume_generate(
    agent: Agent,
    request: ResumeRequest,
    *,
    approved: bool,
    caller: Caller,
    abort_signal: asyncio.Event | None = None,
) -> RunResult:
    """Claim the suspended run and run it to its end, `abort_signal` stopping it (404 / 409 before
    it starts; a failed run raises as `Agent.generate` does)."""
    options = CallOptions(request_context=request.request_context, abort_signal=abort_signal)
    scope = claim_scope(caller)
    try:
        if approved:
            return await agent.approve_tool_call(
                request.run_id, request.tool_call_id, options, resource_id=scope
            )
        return await agent.decline_tool_call(
            request.run_id, request.tool_call_id, request.reason, options, resource_id=scope
        )
    except (MemoryStoreError, SuspendError, RequestContextError) as exc:
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
                **_awaits(saved),
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


def _awaits(saved: SuspendedRun) -> dict[str, Any]:
    """What the awaited call (the first pending one, the only one listed) awaits: an approval, or
    (it suspended itself) data, with the payload it suspended with."""
    suspension = (saved.snapshot.get("pending") or {}).get("suspension")
    if suspension is None:
        return {"requiresApproval": True}
    return {"requiresApproval": False, "suspendPayload": suspension.get("payload")}
