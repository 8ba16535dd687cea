"""Run control, once for both transports: admitting a call, a streamed run held from its start to
its release (`LiveRun`), resuming a suspended run, observing a durable run, cancelling a run.

The HTTP room and the gRPC room parse their requests and shape their answers; what a request does
to the runs of this replica and to the durable ones is here, so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.run import Agent, RunResult, RunStream
from procmesh_orchestrator.run.context import names as key_names
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    DurableRunGoneError,
    RunIdInUseError,
    RunNotActiveError,
)
from procmesh_orchestrator.service.api import durable, runs
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.service.api.context_cases import case_keys, uncased
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.message_keys import count_ignored
from procmesh_orchestrator.service.api.processors import bind_lanes
from procmesh_orchestrator.service.api.results import Chunk, StreamWarnings, model_warnings
from procmesh_orchestrator.service.api.resume import ResumeRequest
from procmesh_orchestrator.service.api.runs import ActiveRun, resume_stream, run_owner, store_errors
from procmesh_orchestrator.store import DurableRun, label

log = logging.getLogger(__name__)


def admit(core: ServiceCore, agent_id: str, call: AgentCall, caller: Caller) -> None:
    """Bind the call's per-call lanes (checked against its request context) and take a run slot
    (DrainingError once draining); pair with the slot's release. A 400 for the context names the
    keys drop mode took out of it: a required key the caller did send is refused as missing."""
    try:
        bind_lanes(core, agent_id, call, caller)
    except BadRequestError as exc:
        if not call.dropped_context:
            raise
        raise BadRequestError(
            f"{exc} (dropped: {key_names(call.dropped_context)}, PROCMESH_UNTRUSTED_CONTEXT=drop)"
        ) from None
    core.gate.enter()
    spec = core.agent(agent_id).spec
    memory = spec.memory
    call.note_memoryless(memory is not None, memory is not None and memory.recall is not None)
    call.note_uncased(uncased(case_keys(spec), call.options.request_context))
    ignored = [*(f"modelSettings.{name}" for name in call.ignored_settings), *call.ignored_options]
    if ignored:  # the warning the caller gets in its result, for the operator too
        log.warning("agent %r: a call's options not applied: %s", agent_id, key_names(ignored))
    for name in call.ignored_labels:
        core.metrics.settings_ignored.labels(name).inc()
    count_ignored(core.metrics, f"agent {agent_id!r}: a call's", call.ignored_message_keys)


async def finished(core: ServiceCore, agent_id: str, run: Awaitable[RunResult]) -> RunResult:
    """`run` to its end, its model warnings noted once (`ServiceCore.note_model_warnings`) however
    it ends: its result's, or a failed run's partial result's (the error's ``result``). Every run
    a route takes to its end (a generate, a resume to its end, over HTTP or gRPC) goes through
    here; a streamed one is noted at its ``step-start`` chunks (`LiveRun.see`), a durable one by
    the replica it ends on (`ServiceCore`, told by `DurableRuns.ended`)."""
    try:
        done = await run
    except BaseException as exc:
        partial = getattr(exc, "result", None)
        if isinstance(partial, RunResult):
            core.note_model_warnings(agent_id, model_warnings(partial))
        raise
    core.note_model_warnings(agent_id, model_warnings(done))
    return done


async def reserve_run_id(core: ServiceCore, agent: Agent, call: AgentCall) -> None:
    """Hold the caller's chosen run id for the call (given back with `release_run_id`), once no
    other run has it: one in flight on this replica, or one the agent's store keeps (suspended,
    resumed or durable, of any resource). RunIdInUseError (409) otherwise: a chosen id never
    reaches another's run, and the answer does not say whose it is."""
    run_id = call.options.run_id
    if run_id is None:
        return
    in_use = RunIdInUseError(f"runId {label(run_id)} is in use by another run: choose another")
    if not core.runs.reserve(run_id):
        raise in_use
    try:
        if agent.spec.store is not None:
            with store_errors():
                store = await agent.spec.store()
                kept = await store.suspended_run_exists(run_id) or await store.get_durable_run(run_id)
            if kept:
                raise in_use
    except BaseException:
        core.runs.discard(run_id)  # the id this call held, never another run's
        raise


def release_run_id(core: ServiceCore, call: AgentCall) -> None:
    """Give the call's chosen run id back (its run ended, or never started)."""
    if call.options.run_id is not None:
        core.runs.discard(call.options.run_id)


class LiveRun:
    """A streamed run of this replica, from its run slot to its release.

    Registered under its run id once its ``start`` chunk names it (`see`), so the cancel route can
    find it; `close` gives everything back once: the registration, the slot, the memory.
    """

    def __init__(
        self,
        core: ServiceCore,
        agent_id: str,
        run: RunStream,
        owner: str,
        warnings: list[dict[str, Any]] | None = None,
    ) -> None:
        self.core = core
        self.agent_id = agent_id
        self.run = run
        self.owner = owner
        """The resource the run is for ("" when none): only its tenant's keys and operators cancel it."""
        self.run_id = ""
        self._closed = False
        self.warnings = StreamWarnings(warnings)
        """The call's own `warnings` and its model calls' seen so far (the HTTP stream's
        ``step-finish`` and ``finish`` carry them)."""

    def see(self, chunk: Chunk) -> None:
        """Note a chunk on its way to the client: the ``start`` chunk registers the run; a
        ``step-start`` chunk's new warnings are counted (`note_model_warnings`)."""
        if chunk.get("type") == "start":
            self.run_id = str((chunk.get("payload") or {}).get("runId", ""))
            self.core.runs.add(self.run_id, ActiveRun(self.agent_id, self.run, self.owner))
        self.core.note_model_warnings(self.agent_id, self.warnings.see(chunk))

    async def close(self, *, abort: bool) -> None:
        """Give the run's slot back (once). With `abort` (its reader left) the run is detached
        and cancelled first, a no-op for a finished run; without, it is awaited to its end."""
        if self._closed:
            return
        self._closed = True
        try:
            if abort:
                self.run.detach()  # no reader any more: the run must not wait for one
                with contextlib.suppress(Exception):
                    await self.run.cancel()
            else:
                with contextlib.suppress(Exception):
                    await self.run.result()
        finally:
            self.core.runs.discard(self.run_id)
            self.core.trim.soon()
            self.core.gate.leave()


async def resume(
    core: ServiceCore,
    agent_id: str,
    agent: Agent,
    request: ResumeRequest,
    *,
    approved: bool,
    caller: Caller,
) -> LiveRun:
    """Take a run slot, claim the suspended run and go on, streamed (404 / 409 before it starts,
    the slot given back then)."""
    core.gate.enter()
    try:
        run = await resume_stream(agent, request, approved=approved, caller=caller)
    except BaseException:
        core.gate.leave()
        raise
    return LiveRun(core, agent_id, run, run_owner(run, caller))


def stream(core: ServiceCore, agent_id: str, agent: Agent, call: AgentCall) -> LiveRun:
    """Start an admitted call's run, streamed (its slot given back when it cannot start)."""
    try:
        run = agent.stream(call.input, call.options)
    except BaseException:
        core.gate.leave()
        release_run_id(core, call)
        raise
    live = LiveRun(core, agent_id, run, call.options.resource_id, call.warnings)
    live.run_id = call.options.run_id or ""  # given back at close, even before the run starts
    return live


async def generate(
    core: ServiceCore, agent_id: str, agent: Agent, call: AgentCall, client_gone: Awaitable[object]
) -> RunResult:
    """Run an admitted call to its end, aborted when its client leaves first (`until_gone`), its
    model warnings noted (`finished`)."""

    def start(signal: asyncio.Event) -> Awaitable[RunResult]:
        return agent.generate(call.input, replace(call.options, abort_signal=signal))

    return await finished(core, agent_id, until_gone(start, client_gone, call.options.abort_signal))


async def resume_generate(
    core: ServiceCore,
    agent_id: str,
    agent: Agent,
    request: ResumeRequest,
    *,
    approved: bool,
    caller: Caller,
    client_gone: Awaitable[object],
) -> RunResult:
    """Approve or decline a suspended run's tool call and run it to its end, aborted as a
    generate is when its client leaves first (404 / 409 before it starts), its model warnings
    noted (`finished`)."""

    def start(signal: asyncio.Event) -> Awaitable[RunResult]:
        return runs.resume_generate(agent, request, approved=approved, caller=caller, abort_signal=signal)

    return await finished(core, agent_id, until_gone(start, client_gone))


async def until_gone(
    start: Callable[[asyncio.Event], Awaitable[RunResult]],
    client_gone: Awaitable[object],
    signal: asyncio.Event | None = None,
) -> RunResult:
    """The run `start` begins with an abort signal, to its end; aborted as a streamed run is when
    its client leaves first (`client_gone` returns): the signal cancels the model, processor and
    tool calls in flight, and the turn so far is saved (`run.caller_abort`)."""
    signal = signal or asyncio.Event()
    run = asyncio.ensure_future(start(signal))
    gone = asyncio.ensure_future(client_gone)
    try:
        await asyncio.wait({run, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone.done() and not run.done():
            signal.set()
        return await run
    finally:
        gone.cancel()


@dataclass
class Observed:
    """A durable run being observed: its manager, its record and its events from the offset asked."""

    durable: DurableRuns
    record: DurableRun
    events: Any
    """The events (offset, chunk) from the offset asked on, as `durable.attach` gives them."""


async def observe(
    core: ServiceCore, run_id: str, offset: int, caller: Caller, *, agent_id: str | None = None
) -> Observed:
    """Reattach to a durable run the caller may see (of `agent_id`, when one is named): 404 for
    another resource's run as for none, 400 for a negative offset. Observing holds no run slot:
    the run goes on whether or not anyone watches."""
    if offset < 0:
        raise BadRequestError("offset: must not be negative")
    record = await durable.visible_run(core, run_id, caller)
    if agent_id is not None and record.agent_id != agent_id:
        raise DurableRunGoneError(f"no durable run {run_id[:64]!r} of agent {agent_id!r}")
    manager = await durable.manager(core.app)
    return Observed(manager, record, await durable.attach(manager, record, offset))


async def cancel_durable(core: ServiceCore, run_id: str, caller: Caller) -> tuple[bool, DurableRun]:
    """Cancel a durable run the caller may see (404 otherwise): whether it was still going, and
    the run after the request."""
    record = await durable.visible_run(core, run_id, caller)
    return await durable.cancel(core, record)


async def cancel_run(core: ServiceCore, agent_id: str, run_id: str, caller: Caller) -> None:
    """Cancel the agent's run: a durable run on whichever replica runs it (its own stops it at its
    next renewal), else a run streaming on this replica (RunNotActiveError when there is none the
    caller may act on)."""
    core.agent(agent_id)
    entry = core.runs.find(agent_id, run_id, caller)
    if entry is None and (core.app.durable is not None or core.app.store is not None):
        try:
            record = await durable.visible_run(core, run_id, caller)
        except (DurableRunGoneError, BadRequestError):
            record = None
        if record is not None and record.agent_id == agent_id:
            cancelled, _ = await durable.cancel(core, record)
            if cancelled:
                return
    if entry is None:
        raise RunNotActiveError(f"no run {run_id[:64]!r} of agent {agent_id!r} is streaming on this replica")
    await entry.run.cancel()
