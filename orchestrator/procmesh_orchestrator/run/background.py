"""Background tool calls: the reference's background task runtime, process-local.

A tool declared to run in the background (`BackgroundTool`: a config ``tools`` entry's
``background``, or an embedder's wrapper around any tool) is started detached from the step, as a
task of this process, with its own timeout and retries (the reference's ``timeoutMs`` and
``maxRetries``; between attempts ``retry_delay`` seconds, doubled each time, at most 30 s, the
reference's backoff). Its disposition decides what the step gets:

- ``deferred``: the model gets the reference's placeholder at once ("Background task started.
  Task ID: ...") and the run goes on;
- ``awaited``: the step waits for the authoritative result, which is the call's result.

The authoritative result is reconciled into the conversation: the call's tool invocation takes
the result (or ``output-error`` with "Background task failed: <error>"), in the run's messages
while the run lives (a later step sees it) and in the stored thread (a later turn sees it) once
the run has saved its turn, whenever the result lands.

Signals are the ``background-work-signals`` processor's (in either lane of the run): the runtime
hands it lifecycle records through its ``process_tool_result`` hook (the record under its
``result_key``), ``running`` when the work starts and ``completed``/``failed`` after the result is
reconciled, and applies the signals it sends. Process-local and best-effort, as the seeds say: a
result that lands after the run ended is persisted, and no signal is sent. A foreground call sends
none. The background call's own chunks and signals (its writer, its hook effects) are not
forwarded: the step it belonged to is over.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from procmesh_orchestrator.run.hooks import Processor, ToolResultArgs
from procmesh_orchestrator.run.tools import Tool, ToolCall, ToolOutcome, Writer

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)

SIGNALS_PROCESSOR = "background-work-signals"
_MAX_RETRY_DELAY = 30.0


@dataclass(frozen=True)
class BackgroundOptions:
    """How a tool runs in the background (the reference's tool ``background`` config)."""

    disposition: Literal["deferred", "awaited"] = "deferred"
    timeout: float = 300.0
    """Seconds for each attempt (the reference's default: 5 minutes)."""
    max_retries: int = 0
    """Attempts after a failed one (the reference's default: none)."""
    retry_delay: float = 1.0
    """Seconds before the first retry, doubled for each next one, at most 30 s."""


@dataclass(frozen=True)
class BackgroundTool:
    """`tool`, run in the background as `background` says; the model sees the same tool."""

    tool: Tool
    background: BackgroundOptions = BackgroundOptions()

    @property
    def name(self) -> str:
        return self.tool.name

    @property
    def description(self) -> str:
        return self.tool.description

    @property
    def input_schema(self) -> dict[str, Any]:
        return self.tool.input_schema

    @property
    def requires_approval(self) -> bool:
        return self.tool.requires_approval

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Start the work; deferred: the placeholder now, awaited: the authoritative result."""
        task_id = str(uuid.uuid4())
        work = asyncio.create_task(_work(run, self, call, task_id))
        _TASKS.add(work)  # held until done: the run may end first
        work.add_done_callback(_TASKS.discard)
        await _lifecycle(run, call, task_id, self.background.disposition, "running")
        if self.background.disposition == "awaited":
            return await asyncio.shield(_state(run).landed[call.call_id])  # an abort leaves it running
        return ToolOutcome(
            f'Background task started. Task ID: {task_id}. The tool "{call.name}" is running in the '
            "background. You will be notified when it completes."
        )


@dataclass
class _RunState:
    """What the runtime knows of one run: which calls' invocations hold their placeholder, the
    authoritative outcomes, and whether the run has ended (its turn saved)."""

    settled: defaultdict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    landed: defaultdict[str, asyncio.Future[ToolOutcome]] = field(
        default_factory=lambda: defaultdict(lambda: asyncio.get_running_loop().create_future())
    )
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    told: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One lifecycle record at a time: the processor's state of the run goes with each call and
    comes back changed, so two at once would lose one's change."""


_STATES: weakref.WeakKeyDictionary[RunCore, _RunState] = weakref.WeakKeyDictionary()
_TASKS: set[asyncio.Task[None]] = set()
_WRITES: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
"""One writer at a time per stored thread (two background calls of one step share a message)."""


def _state(run: RunCore) -> _RunState:
    state = _STATES.get(run)
    if state is None:
        state = _STATES[run] = _RunState()
    return state


def settled(run: RunCore, call_id: str) -> None:
    """The step put the call's result (a deferred call's placeholder) into its invocation: the
    authoritative result may replace it now (`run.tool_calls`)."""
    state = _STATES.get(run)
    if state is not None:
        state.settled[call_id].set()


def ended(run: RunCore) -> None:
    """The run is over and its turn saved (`run.loop`): results landing from now on are persisted
    to the stored thread only, with no signal."""
    state = _STATES.get(run)
    if state is not None:
        state.ended.set()
        run.info.deadline = None  # the run's timeout bound the run; its background work has its own
        for event in state.settled.values():
            event.set()


async def drain() -> None:
    """Wait until every background call of this process has landed and been persisted."""
    while _TASKS:
        await asyncio.gather(*list(_TASKS), return_exceptions=True)


async def _attempts(run: RunCore, tool: BackgroundTool, call: ToolCall) -> ToolOutcome:
    """Run the tool until it succeeds or the attempts are spent; a failure is an error outcome."""
    options, delay = tool.background, tool.background.retry_delay
    for attempt in range(options.max_retries + 1):
        if attempt:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_DELAY)
        outcome = await _attempt(run, tool, call)
        if outcome.error is None or attempt == options.max_retries:
            return outcome
        log.info("run %s: background %s, attempt %d: %s", run.run_id, call.name, attempt + 1, outcome.error)
    raise AssertionError("unreachable: the last attempt returns")


async def _attempt(run: RunCore, tool: BackgroundTool, call: ToolCall) -> ToolOutcome:
    """One attempt; a timeout, a sidecar's failure or a suspension is the attempt's error."""
    timeout = tool.background.timeout
    try:
        async with asyncio.timeout(timeout):
            outcome = await tool.tool.execute(run, call, _no_writer)
    except TimeoutError:
        return ToolOutcome(error=f"tool {call.name!r} timed out after {timeout:g}s")
    except Exception as exc:  # the task's failure, never the run's (it may be over)
        log.warning("run %s: background tool %s failed: %s", run.run_id, call.name, exc)
        return ToolOutcome(error=str(exc))
    if outcome is None or outcome.suspended is not None:
        return ToolOutcome(error=f"tool {call.name!r} cannot suspend while it runs in the background")
    return outcome


async def _no_writer(chunk: dict[str, Any]) -> None:
    """A background call's data chunks have no step to go to."""


async def _work(run: RunCore, tool: BackgroundTool, call: ToolCall, task_id: str) -> None:
    state, disposition = _state(run), tool.background.disposition
    outcome = await _attempts(run, tool, call)
    status = "failed" if outcome.error is not None else "completed"
    if disposition == "awaited":  # told first, as the reference does; the step settles the result
        await _lifecycle(run, call, task_id, disposition, status)
        state.landed[call.call_id].set_result(outcome)
        return
    await state.settled[call.call_id].wait()  # the placeholder is in place (or the run is over)
    if not state.ended.is_set():
        _reconcile(run.ml.view(), call.call_id, outcome)  # the next step sees it
    await _lifecycle(run, call, task_id, disposition, status)
    await state.ended.wait()  # the run's turn is saved: the stored copy takes the result
    try:
        await _persist(run, call.call_id, outcome)
    except Exception:  # the run is over: logged and counted, the stored thread keeps the placeholder
        log.exception("run %s: storing background tool %s's result failed", run.run_id, call.name)
        run.metrics.store_writes_failed.labels(run.agent.id, "background-result").inc()


def _reconcile(messages: list[dict[str, Any]], call_id: str, outcome: ToolOutcome) -> dict[str, Any] | None:
    """Put the authoritative outcome into the call's invocation; the message holding it, if any."""
    for msg in messages:
        for part in (msg.get("content") or {}).get("parts") or []:
            invocation = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
            if invocation is None or invocation.get("toolCallId") != call_id:
                continue
            invocation.pop("result" if outcome.error is not None else "errorText", None)
            if outcome.error is not None:
                invocation.update(state="output-error", errorText=f"Background task failed: {outcome.error}")
            else:
                invocation.update(state="result", result=outcome.result)
            return msg
    return None


async def _persist(run: RunCore, call_id: str, outcome: ToolOutcome) -> None:
    """Put the outcome into the stored thread's copy of the call's message, when the run saved
    one (memory on, not read-only): a later turn then sees the real result."""
    history = run.memory.history if run.memory is not None else None
    if history is None or history.read_only:
        return
    store = history.memory.store
    key = f"{history.resource_id}\0{history.thread_id}"
    lock = _WRITES.get(key)
    if lock is None:
        lock = _WRITES[key] = asyncio.Lock()
    async with lock:
        stored = await store.messages(history.thread_id, history.resource_id)
        message = _reconcile(stored, call_id, outcome)
        if message is None:
            log.warning("run %s: background result of call %s has no stored message", run.run_id, call_id)
            return
        await store.save_turn(history.thread_id, history.resource_id, [message])  # replaced in place


async def _lifecycle(run: RunCore, call: ToolCall, task_id: str, disposition: str, status: str) -> None:
    """Tell the run's background-work-signals processor (if it has one) of the work's status, and
    apply the signals it sends. Best-effort: a failure is logged."""
    state = _state(run)
    async with state.told:
        if not state.ended.is_set():
            await _tell(run, call, task_id, disposition, status)


async def _tell(run: RunCore, call: ToolCall, task_id: str, disposition: str, status: str) -> None:
    seen: set[str] = set()
    for item in (*run.input_lane, *run.output_lane):
        if item.key in seen or _hosted_id(item) != SIGNALS_PROCESSOR or not item.has("process_tool_result"):
            continue
        seen.add(item.key)  # listed in both lanes: one processor, one state
        record = {"taskId": task_id, "disposition": disposition, "status": status, "invocationKind": "tool"}
        result = {_result_key(item): record}
        args = ToolResultArgs(call.name, call.call_id, call.args, result, run.ml.view(), run.steps)
        try:
            answer = await run.call(item, args)
            if answer is not None:
                effects = answer[1]
                if effects.abort is not None:
                    log.warning("run %s: an abort on a lifecycle record is ignored", run.run_id)
                await run.apply(replace(effects, abort=None))
        except Exception:
            log.exception("run %s: background work signal for call %s failed", run.run_id, call.call_id)


# The run knows lane entries by protocol only (it loads no wire): a sidecar's entry
# (`processors.ProcessorHandle`) has the id its sidecar hosts it under, and its options.


def _hosted_id(item: Processor) -> str:
    return str(getattr(item, "hosted_id", "") or getattr(item, "processor_id", ""))


def _result_key(item: Processor) -> str:
    options = getattr(item, "options", None)
    key = options["result_key"] if options is not None and "result_key" in options else None
    return str(key or "_background")
