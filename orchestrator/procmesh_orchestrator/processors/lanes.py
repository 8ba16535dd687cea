"""Lane entries bound to their sidecars: processor handles and a workflow's parallel and conditional steps."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import struct_pb2

from procmesh import ProcessorClient, convert
from procmesh.hooks import BY_ENUM
from procmesh_orchestrator.config.conditions import Call, when_holds
from procmesh_orchestrator.processors import options as entry_options
from procmesh_orchestrator.processors.options import ContextOption, Problem
from procmesh_orchestrator.run.hooks import RunInfo


def hook_names(enums: Iterable[int]) -> frozenset[str]:
    """The hook names of a processor's ``Describe`` entry (values this build does not know are left out)."""
    return frozenset(BY_ENUM[e].name for e in enums if e in BY_ENUM)


@dataclass(frozen=True)
class ProcessorHandle:
    """One lane entry bound to its sidecar: what to call, with which options and policy."""

    key: str
    processor_id: str
    """The processor's identity in the run: state, tripwires, violations, metrics (its `name`, or its id)."""
    client: ProcessorClient
    options: struct_pb2.Struct
    hooks: frozenset[str]
    process_data_parts: bool
    timeout: float
    on_failure: str
    shadow: bool = False
    """Run and record the verdict, never enforce it (a shadow processor also always fails open)."""
    hosted_id: str = ""
    """The id the sidecar hosts it under, when the lane entry renamed it (several instances)."""
    tool_host: bool = False
    """The sidecar's hosted tools, not a processor: ExecuteTool goes with an empty processor id."""
    speculative: bool = False
    """Describe declared it speculative and its lane entry left that on: it may be called before
    its input is final (`run.speculation`)."""
    judged: bool = False
    """Its options name a model (a judge it asks through the model gateway): cheap first, it is
    sent only once the cheaper entries in front of it answered (`run.speculation.plan`)."""
    fuse_key: str = ""
    """Lane neighbours with the same non-empty key share one request (the sidecar's name when its
    Describe says ``fuses``); empty: never fused (shadow processors, tool hosts)."""
    stream_timeout: float = 600.0
    """Seconds one ProcessOutputStream session may stay open (``streamTimeout``; the run's remaining
    deadline caps it); `timeout` bounds each part's answer and the stream's end."""
    sidecar: str = ""
    """The config's name of the sidecar it runs on (its metrics' ``sidecar`` label)."""

    fixed_options: Mapping[str, Any] | None = None
    """The options that are the same for every run, when some come from the request context."""
    context_options: tuple[ContextOption, ...] = ()
    """Options each run takes from its request context (`processors.options`)."""
    options_problem: Problem | None = None
    """Checks a run's options against the published schema: the failing path and message, or None."""

    def has(self, hook: str) -> bool:
        """Whether the processor implements `hook`."""
        return hook in self.hooks

    @property
    def source(self) -> tuple[str, str]:
        """(sidecar, hosted processor id): with the agent and `processor_id`, its metrics' labels."""
        return (self.sidecar, self.hosted_id or self.processor_id)

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ProcessorHandle, ...]:
        """Itself, with this run's options when some come from the request context (checked
        against the published schema: RequestContextError before any hook is called)."""
        if not self.context_options:
            return (self,)
        options = entry_options.resolve(self.fixed_options or {}, self.context_options, request_context)
        entry_options.check_run_options(
            self.processor_id, self.context_options, options, self.options_problem
        )
        return (replace(self, options=convert.to_struct(options)),)


@dataclass(frozen=True)
class ParallelGroup:
    """A workflow's parallel step: branches run concurrently on the same input.

    Every branch's signals, custom chunks and aborts apply (the first abort in
    branch order wins, with its own processor id); the `pick` branch's result
    (its messages, prompt, part) is what goes on, as ``.map()`` chooses in the seeds,
    or with `merge` each result field from the first or last branch that set it.

    It runs its branches itself, so it is not `Batchable` (no ``speculative``, no ``fuse_key``):
    the run calls it on its own, never in a speculative or fused request.
    """

    key: str
    processor_id: str
    branches: tuple[ProcessorHandle, ...]
    pick: int = 0
    """The branch whose result goes on; with `merge`, whose stream parts go on (the first or the
    last) and whose failure policy answers for the group's result."""
    merge: str = ""
    """``first`` or ``last``: the result field by field from the first (last) branch, in listed
    order, whose answer set it; empty: the `pick` branch's result."""

    def has(self, hook: str) -> bool:
        """Whether any branch implements `hook`."""
        return any(b.has(hook) for b in self.branches)

    @property
    def source(self) -> tuple[str, str]:
        """The picked branch's (it answers for the group)."""
        return self.branches[self.pick].source

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ParallelGroup, ...]:
        """Itself, its branches with this run's options: the group runs as one lane entry."""
        branches = tuple(p for b in self.branches for p in b.expand(request_context))
        return (self if branches == self.branches else replace(self, branches=branches),)


@dataclass(frozen=True)
class Conditional:
    """A workflow's conditional step, or a lane entry with a `when`: `then` when `when` holds for
    the request context (`config.conditions.when_holds`), else `otherwise`."""

    when: dict[str, Any] | list[dict[str, Any]]
    then: tuple[ProcessorHandle, ...]
    otherwise: tuple[ProcessorHandle, ...] = ()

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ProcessorHandle, ...]:
        """The branch this run takes (decided once per run)."""
        ok = when_holds(self.when, request_context)
        return tuple(p for h in (self.then if ok else self.otherwise) for p in h.expand(request_context))


@dataclass(frozen=True)
class TryCatch:
    """A workflow's error step: `attempt` is called; when it fails as the run would fail for it
    (its failure policy raised `ProcessorFailedError`), `fallback` is called in its place with
    the same arguments. A tripwire is an answer, not a failure: it is never caught.

    It is not `Batchable` (no speculative or fused sending): the caller calls it itself.
    """

    key: str
    attempt: ProcessorHandle | ParallelGroup
    fallback: ProcessorHandle | ParallelGroup

    def has(self, hook: str) -> bool:
        """Whether the attempt implements `hook` (the fallback stands in only for its failure)."""
        return self.attempt.has(hook)

    def expand(self, request_context: Mapping[str, Any]) -> tuple[TryCatch, ...]:
        """Itself, both sides with this run's options."""
        (attempt,) = self.attempt.expand(request_context)
        (fallback,) = self.fallback.expand(request_context)
        if attempt is self.attempt and fallback is self.fallback:
            return (self,)
        return (replace(self, attempt=attempt, fallback=fallback),)


def last_user_text(args: Any) -> str | None:
    """The text of the last user message a hook's arguments carry (its messages, or a model
    request's prompt), text parts joined by newlines; None when there is none."""
    messages = getattr(args, "messages", None)
    if messages is None:
        messages = getattr(args, "prompt", None) or []
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        parts = content.get("parts", []) if isinstance(content, dict) else content or []
        return "\n".join(p.get("text", "") for p in parts if p.get("type") == "text")
    return None


@dataclass(frozen=True)
class Gated:
    """A workflow conditional's processor (or a lane entry's) whose `when` tests the call (the
    last user message, the step number, the retry count): decided at each hook call, on that
    call's arguments (the seeds' ``.branch()`` runs its condition whenever the workflow runs);
    `holds` says on which side of it it runs."""

    key: str
    item: ProcessorHandle
    when: Any
    holds: bool = True
    """True: runs when `when` holds (``then``); False: when it does not (``otherwise``)."""

    def has(self, hook: str) -> bool:
        """Whether its processor implements `hook`."""
        return self.item.has(hook)

    def runs(self, args: Any, info: RunInfo) -> bool:
        """Whether it runs for this call of the run `info` describes. Its context conditions see
        what the run's other conditions see (`run.base.choosing_context`): the request context
        as it is now, with the run's resource under ``resourceId``."""
        context = info.request_context
        if info.resource_id:
            context = {**context, "resourceId": info.resource_id}
        call = Call(last_user_text(args), info.step_number, info.retry_count)
        return when_holds(self.when, context, call) == self.holds

    def expand(self, request_context: Mapping[str, Any]) -> tuple[Gated, ...]:
        """Itself, its processor with this run's options."""
        (item,) = self.item.expand(request_context)
        return (self if item is self.item else replace(self, item=item),)


LaneItem = ProcessorHandle | ParallelGroup | Conditional | TryCatch | Gated
"""A resolved lane entry; conditionals are decided once per run."""
RunLaneItem = ProcessorHandle | ParallelGroup
"""A lane entry as a run streams it (an error step streams as its attempt); `TryCatch` too in
unary hooks."""


def handles_in(items: Iterable[object]) -> Iterator[ProcessorHandle]:
    """Every processor handle bound in lane items, whichever workflow step holds it (a cost slot
    holds none)."""
    for item in items:
        if isinstance(item, ProcessorHandle):
            yield item
        elif isinstance(item, ParallelGroup):
            yield from item.branches
        elif isinstance(item, Conditional):
            yield from (*item.then, *item.otherwise)
        elif isinstance(item, TryCatch):
            yield from handles_in((item.attempt, item.fallback))
        elif isinstance(item, Gated):
            yield item.item
