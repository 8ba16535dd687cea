"""Memory in the run: message history as framework processors around yours (SPEC §2, §3, §5).

With a thread, `MessageHistory` heads the input lane (processInput: the thread's last
``lastMessages`` stored messages go ahead of the call's input, so your processInput and
processInputStep see them) and tails the output lane (processOutputResult: this call's input and
response messages, in their final form, saved in one `save_turn`). Everything the seeds ask of
the save follows from those two places and from the message list's sources:

- an abort in any input or output hook ends the run before the tail, so nothing is saved;
- processInput/processInputStep/processToolResult rewrites are in the message list, so they are
  saved as rewritten; processLLMRequest rewrites only touch the prompt, so they never are;
- a rejected (retried) attempt never enters the message list; its feedback turn is a persistent
  signal and is saved where it was sent; transient signals are dropped here;
- loaded history keeps its ``memory`` source, so it is never saved again, even when rewritten.

With working memory (`working_memory`), its processor goes first: it adds the instruction and the
stored data as a system message, and the call offers the model ``updateWorkingMemory``. A call's
`MemoryCallOptions` may narrow the window and make memory read-only (nothing saved, no tool).

With a token budget (``messageHistory``, `history_budget`) the history loads from the thread's
boundary and, once recall ran and again before each step (processInputStep, where a tool loop's
results grow the prompt), the oldest of it leaves the prompt until the prompt fits.

`ContextWindowRecovery` tails the error lane: on a context-length rejection it drops the oldest
loaded history and asks for a retry (within the run's shared retry budget).
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from procmesh_orchestrator.errors import FencedWriteError, InvalidMemoryInputError, MemoryStoreError
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.framework import FrameworkProcessor, history_budget
from procmesh_orchestrator.run.framework.echo import drop_echoes
from procmesh_orchestrator.run.framework.history_budget import Boundary, HistoryBudget
from procmesh_orchestrator.run.framework.working_memory import (
    TOOL_NAME,
    UpdateWorkingMemoryTool,
    WorkingMemoryProcessor,
    WorkingMemorySettings,
)
from procmesh_orchestrator.run.hooks import (
    APIErrorArgs,
    APIErrorResult,
    HookArgs,
    InputArgs,
    InputStepArgs,
    OutputResultArgs,
)
from procmesh_orchestrator.store import MemoryStore, client_message

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore
    from procmesh_orchestrator.run.framework.recall import SemanticRecall

log = logging.getLogger(__name__)

R = TypeVar("R")
Message = dict[str, Any]

_CONTEXT_LENGTH = re.compile(
    r"context[ _-]?(length|window)|maximum context|too many tokens|prompt is too long|"
    r"input is too long|exceeds? the (model'?s? )?(maximum|max|token|context)|reduce the length",
    re.IGNORECASE,
)
"""How providers word a context-length rejection (OpenAI, Anthropic, vLLM, llama.cpp, proxies)."""


@dataclass(frozen=True)
class MemoryCallOptions:
    """One call's memory options (the reference's ``memory.options``); None: the agent's."""

    last_messages: int | None = None
    """The history window for this call (0: load no history)."""
    read_only: bool | None = None
    """Load history and working memory, save nothing, offer no ``updateWorkingMemory``."""
    semantic_recall: bool | None = None
    """Semantic recall on or off for this call (where the agent configures it)."""
    message_history: HistoryBudget | None = None
    """A token budget on history for this call (the reference's ``messageHistory``)."""


@dataclass(frozen=True)
class AgentMemory:
    """An agent's message-history memory: where its threads live and how much of one a run sees."""

    store: MemoryStore
    last_messages: int | None = 10
    """The window: how many of the thread's most recent stored messages a run loads (None: no
    count, only `message_history`'s token budget)."""
    store_name: str = "memory store"
    """How the store names itself in its errors (``sqlite:/var/lib/procmesh/memory.db``; never a
    password): logged, and cut from what a client reads."""
    working_memory: WorkingMemorySettings | None = None
    """The agent's working memory (None: it has none)."""
    read_only: bool = False
    """Load, never write (the reference's ``readOnly``); a call's options may turn it on."""
    recall: SemanticRecall | None = None
    """The agent's semantic recall (`run.framework.recall`; None: the window only); a call's
    options may turn it off."""
    message_history: HistoryBudget | None = None
    """A token budget on the history each call loads (`history_budget`; None: the window only)."""
    window_given: bool = True
    """Whether the config set ``lastMessages``: if not, a call's token budget replaces the default
    window instead of capping it (the reference's ``getMergedThreadConfig``)."""

    def for_call(
        self, thread_id: str, resource_id: str, options: MemoryCallOptions | None = None
    ) -> CallMemory | None:
        """The memory processors of one call; None without a thread (neither loads nor saves)."""
        if not thread_id:
            return None
        if not resource_id:
            raise MemoryStoreError(
                f"memory: thread {thread_id!r} was given without a resource; "
                "a thread belongs to one resource (a user, an org): pass both"
            )
        options = options or MemoryCallOptions()
        read_only = self.read_only if options.read_only is None else options.read_only
        window = self.last_messages if options.last_messages is None else options.last_messages
        budget = options.message_history or self.message_history
        if options.message_history and options.last_messages is None and not self.window_given:
            window = None if self.message_history is None else window
        recall = None if options.semantic_recall is False else self.recall
        history = MessageHistory(
            self, thread_id, resource_id, window=window, read_only=read_only, recall=recall, budget=budget
        )
        working = None
        if self.working_memory is not None:
            working = WorkingMemoryProcessor(
                self.store, self.working_memory, resource_id, thread_id, read_only
            )
        history.working = working
        return CallMemory(history, ContextWindowRecovery(history), working)


@dataclass(frozen=True)
class CallMemory:
    """Memory's processors for one call: `working` (when the agent has working memory) and
    `history` head the input lane, `history` tails the output lane, `recovery` tails the error lane."""

    history: MessageHistory
    recovery: ContextWindowRecovery
    working: WorkingMemoryProcessor | None = None

    @property
    def input_processors(self) -> tuple[FrameworkProcessor, ...]:
        """What goes ahead of the input lane, in the reference's order."""
        return (self.history,) if self.working is None else (self.working, self.history)

    @property
    def tools(self) -> dict[str, UpdateWorkingMemoryTool]:
        """The tools memory offers the model (``updateWorkingMemory`` unless read-only)."""
        tool = self.working.tool() if self.working is not None else None
        return {} if tool is None else {tool.name: tool}


def _is_transient_signal(msg: Message) -> bool:
    meta = (msg.get("content") or {}).get("metadata") or {}
    return msg.get("role") == "signal" and bool((meta.get("signal") or {}).get("transient"))


def _kept(part: dict[str, Any], keep_calls: bool) -> bool:
    if part.get("type") != "tool-invocation":
        return True
    invocation = part["toolInvocation"]
    if invocation.get("toolName") == TOOL_NAME:  # the reference never stores working-memory updates
        return False
    return keep_calls or invocation.get("state") != "call"


def storable(messages: list[Message], *, keep_calls: bool = False) -> list[Message]:
    """What of a turn's messages memory stores: no system messages, no transient signals, no
    ``updateWorkingMemory`` call, no message left without parts (an empty step), and no tool call
    that never got its result, unless `keep_calls` (a turn that ended for the client's tools to
    run: the client's next call sends the results, which settle these calls in the loaded history)."""
    out: list[Message] = []
    for msg in messages:
        if msg.get("role") == "system" or _is_transient_signal(msg):
            continue
        content = msg.get("content")
        if isinstance(content, dict):
            parts = [p for p in content.get("parts") or [] if _kept(p, keep_calls)]
            if not parts:
                continue
            msg = {**msg, "content": {**content, "parts": parts}}
        out.append(copy.deepcopy(msg))
    return out


class MessageHistory(FrameworkProcessor):
    """Loads the thread's recent history before your input processors; saves the turn after your
    output processors (the reference's ``message-history``)."""

    processor_id = "message-history"
    hooks = frozenset({"process_input", "process_output_result"})

    def __init__(
        self,
        memory: AgentMemory,
        thread_id: str,
        resource_id: str,
        *,
        window: int | None,
        read_only: bool = False,
        recall: SemanticRecall | None = None,
        budget: HistoryBudget | None = None,
    ) -> None:
        self.memory = memory
        self.recall = recall
        """This call's semantic recall: after the window loads, and embedding the saved turn."""
        self.thread_id = thread_id
        self.resource_id = resource_id
        self.window = window
        """How many stored messages this call loads (the agent's ``lastMessages`` or the call's;
        None: as many as `budget` takes)."""
        self.budget = budget
        """This call's token budget on history (`history_budget`), or None."""
        if budget is not None:  # the reference's limiter checks again before every step
            self.hooks = frozenset({*self.hooks, "process_input_step"})
        self.read_only = read_only
        self.key = f"memory:{self.processor_id}"
        self.working: WorkingMemoryProcessor | None = None
        """The call's working memory, which ran just before: its system message is memory's too."""

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if isinstance(args, InputArgs):
            await self.load(run)
        elif isinstance(args, InputStepArgs) and self.budget is not None:
            await self._trim(run, self.budget)
        elif isinstance(args, OutputResultArgs):
            await self.save(run, args.finish_reason)
        return None

    def _failed(self, run: RunCore, doing: str, exc: Exception) -> MemoryStoreError:
        """The error the run fails with: what a client may read (never the store's address or the
        driver's text); the whole error goes to the log."""
        kind = type(exc) if isinstance(exc, MemoryStoreError) else MemoryStoreError
        level = logging.WARNING if isinstance(exc, InvalidMemoryInputError) else logging.ERROR
        log.log(
            level,
            "run %s: memory (%s): %s thread %r of resource %r failed: %s",
            run.run_id,
            self.memory.store_name,
            doing,
            self.thread_id,
            self.resource_id,
            exc,
            exc_info=not isinstance(exc, MemoryStoreError),
        )
        reason = (
            client_message(exc, self.memory.store_name)
            if isinstance(exc, MemoryStoreError)
            else "the memory store failed"
        )
        return kind(f"memory: {doing} thread {self.thread_id!r} failed: {reason}")

    async def load(self, run: RunCore) -> None:
        """Put the window of stored messages, oldest first, ahead of the call's input.

        One read, filtered on this call's resource in the same statement: thread ids are scoped by
        resource, so another resource's thread of the same id is another thread, never read here
        (and a thread this resource has not saved to yet loads as empty, whoever else uses the id).
        """
        try:
            stored, tail = await (self._budgeted() if self.budget else self._window(run))
        except Exception as exc:
            raise self._failed(run, "loading", exc) from exc
        history = [m for m in stored if m.get("role") != "system" and not _is_transient_signal(m)]
        run.ml.prepend(history, msgs.MEMORY)
        drop_echoes(run, tail)
        recalled_from = len(run.system)
        if self.recall is not None:
            try:
                await self.recall.recall(run, self.thread_id, self.resource_id)
            except MemoryStoreError as exc:
                raise self._failed(run, "recalling from", exc) from exc
        run.ml.merge_resent_calls()
        run.unsettled_results = run.ml.settle_tool_calls(run.unsettled_results, msgs.INPUT)
        if self.budget is not None:
            await self._trim(run, self.budget)
        added = self.working.added if self.working is not None else None
        self._record(run, [*([added] if added else []), *run.system[recalled_from:]])

    def _record(self, run: RunCore, system: list[Message]) -> None:
        """What memory made of the call's prompt, for replay (``agents.ID.recordInputs``): its
        system messages, the message list once it loaded (history, recalled messages, the input
        without what the client echoed), and the tools it offers; a replay gives the candidate
        exactly this instead of reading the store (`replay.memory`)."""
        tools = [
            {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in run.memory_tools.values()
        ]
        messages = [[m, source] for m, source in run.ml.dump()]
        body = {"system": system, "messages": messages, "unsettled": run.unsettled_results, "tools": tools}
        if self.budget is not None:  # the trims before each step follow from it
            body["budget"] = self.budget.as_json()
        run.record_input("memory-context", 0, body)

    async def _window(self, run: RunCore) -> tuple[list[Message], list[Message]]:
        """The last `window` stored messages, and a tail long enough to find what the client
        echoes of the conversation (one read)."""
        window = self.window or 0
        echo_span = len(run.ml.view(msgs.INPUT))
        tail = await self.memory.store.messages(
            self.thread_id, self.resource_id, last=window + echo_span, include_signals=True
        )
        return (tail[max(0, len(tail) - window) :] if window else []), tail

    async def _budgeted(self) -> tuple[list[Message], list[Message]]:
        """The history under a token budget (`history_budget.load`), from the thread's boundary."""
        budget = self.budget
        if budget is None or budget.max_tokens == 0 or self.window == 0:
            return [], []  # the reference: a zero budget or window disables history
        store = self.memory.store
        thread = await store.get_thread(self.thread_id, self.resource_id)
        boundary = Boundary.read(thread.metadata, budget) if thread is not None else None

        async def read_last(n: int) -> list[Message]:
            return await store.messages(self.thread_id, self.resource_id, last=n, include_signals=True)

        loaded = await history_budget.load(read_last, budget, boundary, self.window)
        return loaded, loaded

    async def _trim(self, run: RunCore, budget: HistoryBudget) -> None:
        """The reference's ``memory-token-limiter``: over budget, the oldest history goes from
        the prompt (never from the store) and the thread's boundary moves past it."""
        removed = trim_prompt(run, budget)
        local = [m for m in removed if m.get("threadId", self.thread_id) == self.thread_id]
        if self.read_only or not local:
            return
        store = self.memory.store
        try:
            thread = await store.get_thread(self.thread_id, self.resource_id)
            if thread is None:
                return
            previous = Boundary.read(thread.metadata, budget)
            boundary = history_budget.advance(previous, local, budget)
            if boundary is None or boundary == previous:
                return
            metadata = {**thread.metadata, history_budget.BOUNDARY_KEY: boundary.as_metadata()}
            await store.update_thread(self.thread_id, self.resource_id, metadata=metadata)
        except Exception as exc:
            raise self._failed(run, "saving the history boundary of", exc) from exc

    async def save(self, run: RunCore, finish_reason: str) -> None:
        """Save this call's input and response messages, in their final form, as one turn
        (nothing when memory is read-only for this call)."""
        if self.read_only:
            return
        response = run.ml.view(msgs.RESPONSE)
        if finish_reason == "error" and not storable(response):
            return  # a turn that failed before any answer: its input would be an orphan question
        turn = storable(run.ml.view(msgs.INPUT, msgs.RESPONSE), keep_calls=finish_reason == "tool-calls")
        if not turn:
            return
        # The turn's embeddings go in its transaction: history is never embedded again.
        vectors = await self.recall.embed_turn(run, turn) if self.recall is not None else []
        extra = {"embeddings": vectors} if vectors else {}
        try:
            await self.memory.store.save_turn(
                self.thread_id, self.resource_id, turn, fence=run.fence, **extra
            )
        except Exception as exc:
            if isinstance(exc, FencedWriteError):  # a durable run another replica holds now
                run.fenced("memory", exc)
            raise self._failed(run, "saving a turn to", exc) from exc


def trim_prompt(run: RunCore, budget: HistoryBudget) -> list[Message]:
    """Take the oldest history (loaded or recalled) from the prompt until it fits `budget`
    (`history_budget.trim`); what went, for the thread's boundary."""
    removable = {m["id"] for m in run.ml.view(msgs.MEMORY)}
    system = [msgs.message_text(m) for m in run.system]
    removed = history_budget.trim(budget, system, run.ml.items, removable)
    for msg in removed:
        run.ml.remove(msg["id"])
    return removed


def _turns(loaded: list[Message]) -> list[list[Message]]:
    """Loaded messages grouped into turns (a user message and all that followed it, tool calls and
    their results included), so recovery never drops half a tool pair or a question without its
    answer. Messages before the first user message are a turn of their own."""
    turns: list[list[Message]] = []
    for msg in loaded:
        if msg.get("role") == "user" or not turns:
            turns.append([msg])
        else:
            turns[-1].append(msg)
    return turns


class ContextWindowRecovery(FrameworkProcessor):
    """On a context-length rejection, drops the older half of the loaded history and retries.

    Whole turns go, oldest first, until at least half the loaded messages are gone: never a system
    message (they are not loaded), never this turn (input, response, signals sent now), never half
    a tool call/result pair. Each retry counts against the run's shared budget;
    when no loaded history is left it lets the error through.
    """

    processor_id = "memory-context-window"
    hooks = frozenset({"process_api_error"})

    def __init__(self, history: MessageHistory) -> None:
        self.history = history
        self.key = f"memory:{self.processor_id}"

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if not isinstance(args, APIErrorArgs) or not is_context_length(args):
            return None
        turns = _turns(run.ml.view(msgs.MEMORY))
        if not turns:
            return None
        total = sum(len(t) for t in turns)
        dropped = 0
        while turns and dropped * 2 < total:
            for msg in turns.pop(0):
                run.ml.remove(msg["id"])
                dropped += 1
        log.warning(
            "run %s: the model rejected the prompt as too long; dropped the %d oldest of %d loaded "
            "messages of thread %r and retrying",
            run.run_id,
            dropped,
            total,
            self.history.thread_id,
        )
        return cast(R, APIErrorResult(retry=True))


def is_context_length(args: APIErrorArgs) -> bool:
    """Whether a provider's rejection says the prompt does not fit the model's context window."""
    if not 400 <= args.status < 500:
        return False
    return any(_CONTEXT_LENGTH.search(text) for text in (args.message, args.body) if text)
