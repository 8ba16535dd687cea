"""One processor's answer to a unary hook, held until the run commits or discards it (`HookAttempt`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from google.protobuf import struct_pb2

from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.processors import wire
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.run import context
from procmesh_orchestrator.run.hooks import Effects, Reply

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller

R = TypeVar("R")

_STATE = tpb.HookEffects.DESCRIPTOR.fields_by_name["state"]


def _outcome(response: Any, effects: Effects) -> str:
    """A hook call's outcome for its span: abort, retry (an abort that replays), rewrite, pass."""
    if effects.abort is not None:
        return "retry" if effects.abort.retry else "abort"
    changed = any(field.name != "effects" for field, _ in response.ListFields())
    return "rewrite" if changed else "pass"


class HookAttempt(Generic[R]):
    """One processor's answer to a sent hook, applied only when the run commits it.

    Until then nothing of it exists for the run: its state, its metrics, its failure policy
    (a fail-closed failure of a call whose input turned out stale raises nothing) all wait for
    `commit`; `discard` drops it (a speculative call whose input changed).
    """

    def __init__(
        self, caller: GrpcHookCaller, handle: ProcessorHandle, hook: str, speculative: bool, took: float
    ) -> None:
        self.caller = caller
        self.handle = handle
        self.hook = hook
        self.speculative = speculative
        self.took = took
        self.response: Any = None
        self.effects = Effects()
        self.state: struct_pb2.Struct | None = None
        self.seen: tuple[str, str | None] = ("", None)
        """What the processor was given, for the decision record (`DecisionLog.seen`)."""
        self.failure = ""
        self.refused = False

    def failed(self, cause: str, *, refused: bool = False) -> HookAttempt[R]:
        self.failure, self.refused = cause, refused
        return self

    def answered(self, response: Any, effects: tpb.HookEffects) -> None:
        wire.check_flags(self.hook, response)
        self.response = response
        listed = effects.ListFields()
        if not listed:  # no effects: nothing to read
            return
        if len(listed) == 1 and listed[0][0] is _STATE:  # its state alone (most answers)
            self.state = effects.state
            return
        self.effects = wire.read_effects(
            self.handle.processor_id, self.hook, effects, source=self.handle.source
        )
        if effects.HasField("state"):
            self.state = effects.state

    def span_outcome(self) -> str:
        return "failure" if self.failure else _outcome(self.response, self.effects)

    def would(self) -> str:
        """What an answered call would do if enforced (`MONITOR_DECISIONS`): abort, retry,
        rewrite or pass."""
        return _outcome(self.response, self.effects)

    def settle(self) -> tuple[Any, Effects]:
        """Apply it: the state, the metrics, the failure policy (raises when fail-closed);
        (response, effects), the response None when nothing of it applies."""
        handle, hook, metrics = self.handle, self.hook, self.caller.metrics
        labels = self.caller.series(handle)
        if self.speculative:
            metrics.speculative_calls.labels(*labels, hook, "committed").inc()
        metrics.processor_call_took(labels, hook, self.took)
        record = self.caller.decisions
        if self.failure:
            self.caller.fail(
                handle, hook, self.failure, input_refused=self.refused, took=self.took, seen=self.seen
            )
            return None, Effects()
        if handle.shadow:
            metrics.processor_call(labels, hook, "monitor")
            self.caller.monitor_decision(handle, hook, self.would(), self.effects.abort)
            if record is not None:
                step = self.caller.info.step_number
                record.add(labels, hook, step, "monitor", took=self.took, seen=self.seen, would=self.would())
            return None, Effects(violations=self.effects.violations)
        if self.effects.context:  # a refused value fails the call, under its policy (`run.context`)
            refused = context.accept(self.caller.info, self.effects.context)
            if refused is not None:
                self.caller.fail(handle, hook, refused, took=self.took, seen=self.seen)
                return None, Effects()
        if self.state is not None:
            self.caller.info.states[handle.processor_id] = self.state
        metrics.processor_call(labels, hook, "abort" if self.effects.abort else "ok")
        if record is not None:
            step = self.caller.info.step_number
            record.add(labels, hook, step, self.would(), took=self.took, seen=self.seen)
        return self.response, self.effects

    def commit(self) -> Reply[R]:
        """Apply it (`settle`) and read the hook's result."""
        response, effects = self.settle()
        return Reply(None if response is None else wire.read_result(self.hook, response), effects)

    def discard(self) -> None:
        """Drop it: nothing of it applies (counted when it was speculative)."""
        if self.speculative:
            labels = self.caller.series(self.handle)
            self.caller.metrics.speculative_calls.labels(*labels, self.hook, "discarded").inc()
