"""The agent loop: preparation, model steps with their processor hooks, finalization (SPEC §2)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from procmesh import RUN_ID, TRACE_ID, tracing
from procmesh_orchestrator.errors import (
    APICallError,
    FencedWriteError,
    LeaseLostError,
    MemoryStoreError,
    ProcessorFailedError,
    RunTimeoutError,
    SuspendError,
    TripwireAbort,
)
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import (
    attachments,
    background,
    caller_abort,
    optimistic,
    retries,
    snapshot,
    steps,
    structured,
)
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.base import ChunkSink, RunCore
from procmesh_orchestrator.run.model_step import assistant_message, model_step, step_record
from procmesh_orchestrator.run.steps import StepOutcome
from procmesh_orchestrator.run.stop import should_stop
from procmesh_orchestrator.run.tool_calls import Decision, PendingTools, answer_for, run_tools
from procmesh_orchestrator.run.types import AgentSpec, CallOptions, RunResult, assistant_metadata
from procmesh_orchestrator.store import client_message

RUN_DEADLINE_GRACE = 0.05
log = logging.getLogger(__name__)


def normalize_input(value: str | list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Caller input as (system messages, conversation messages)."""
    if isinstance(value, str):
        return [], [msgs.text_message("user", value)]
    systems: list[dict[str, Any]] = []
    convo: list[dict[str, Any]] = []
    for item in value:
        if "content" in item and isinstance(item["content"], dict):
            msg = dict(item)
            msg.setdefault("id", msgs.new_id())
        else:
            role = item.get("role", "user")
            if role not in ("user", "assistant", "system"):
                raise ValueError(f"input message role must be user, assistant or system, got {role!r}")
            msg = msgs.text_message(role, str(item.get("text", item.get("content", ""))))
        (systems if msg["role"] == "system" else convo).append(msg)
    return systems, convo


LoopEnd = str | PendingTools
"""How the loop ended: its finish reason, or the step's calls from the first one awaiting approval
(the run suspends: `_execute` keeps it in the store). A suspension is an outcome the loop returns,
not an error: nothing between the tool call and `_execute` has to let it pass."""


class Run(RunCore):
    """One generate()/stream() call, or the resumption of a suspended one: `execute()` runs it."""

    first_call: optimistic.EarlyCall | None = None
    """Step 0's model call, started before the input processors committed (`run.optimistic`)."""

    model_index = 0
    """Which of the agent's models the steps call (`AgentSpec.fallbacks`): a call the error
    processors did not recover moves it on, for the rest of the run."""
    answered_by: str | None = None
    """The model that answered the last model call (`RunResult.model_id`)."""
    structured_in_step = False
    """The structuring model already gave `object` in the answer's step (`_structure_answer`)."""

    @classmethod
    def resume(
        cls,
        agent: AgentSpec,
        saved: dict[str, Any],
        decision: Decision | None,
        options: CallOptions,
        *,
        sink: ChunkSink | None,
        metrics: OrchestratorMetrics,
    ) -> Run:
        """A run rebuilt from its snapshot: to go on from the call that awaited `decision`, or (a
        step boundary's snapshot, no decision) from the step after it.

        processInput does not run again (the lifecycle seed): the messages, processor state,
        retry counter and signals are the snapshot's.
        """
        options = snapshot.resumed_options(saved, options, agent)
        run = cls(agent, "", options, sink=sink, metrics=metrics, run_id=saved["runId"])
        pending = snapshot.restore(run, saved)
        if pending is None:
            run.resume_step = int(saved["nextStep"])
        else:
            assert decision is not None, "a snapshot at a tool call resumes with its decision"
            run.resume_from = (pending, answer_for(pending, decision, run.run_id))
        return run

    async def execute(self) -> tuple[RunResult, BaseException | None]:
        """Run to the end; the result, and the failure that ended it (None when it did not fail)."""
        token = RUN_ID.set(self.run_id)  # every log line of the run names it (--log-format json)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.agent.id,
            "procmesh.run.id": self.run_id,
            "gen_ai.conversation.id": self.info.thread_id or None,
        }
        name = f"invoke_agent {self.agent.id}"
        pin = self.agent.pin() if self.agent.pin is not None else contextlib.nullcontext()
        try:
            with pin, tracing.span(name, parent=self.options.trace_parent, attributes=attributes) as span:
                trace_token = TRACE_ID.set(span.trace_id())  # JSON log lines of the run carry it
                try:
                    result, failure = await self._execute()
                finally:
                    TRACE_ID.reset(trace_token)
                await self.record_decisions()
                result.trace_id = span.trace_id() or None
                span.outcome(result.status)
                span.set("gen_ai.response.finish_reasons", [result.finish_reason])
                span.set("gen_ai.usage.input_tokens", result.usage.get("inputTokens"))
                span.set("gen_ai.usage.output_tokens", result.usage.get("outputTokens"))
                return result, failure
        finally:
            background.ended(self)  # its turn is saved: background results go to the store now
            if self.agent.ended is not None:
                self.agent.ended(self.run_id)  # its guards' judge questions in flight are cancelled
            RUN_ID.reset(token)

    async def _execute(self) -> tuple[RunResult, BaseException | None]:
        started = time.perf_counter()
        self.emit({"type": "start", "payload": {"runId": self.run_id}})
        tripwire: TripwireAbort | None = None
        failure: BaseException | None = None
        finish_reason = "stop"
        suspended: PendingTools | None = None
        aborted = False
        try:
            # Processor calls are cut at the deadline itself and name the processor that was slow;
            # the run-wide timer fires just after, for whatever else still runs (the model, tools).
            timeout = self.options.timeout + RUN_DEADLINE_GRACE if self.options.timeout else None
            async with asyncio.timeout(timeout):
                end = await caller_abort.until_aborted(self, self._prepare_and_loop())
                if end is None:
                    aborted = True
                elif isinstance(end, PendingTools):
                    suspended = end
                else:
                    finish_reason = end
        except TripwireAbort as abort:
            tripwire = abort
        except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
            failure = exc
        except TimeoutError:
            failure = RunTimeoutError(self.options.timeout or 0)
        if aborted:
            tripwire, error = await caller_abort.finalize(self)
            result = self._stopped("aborted", started, error=error)
            result.tripwire = tripwire.as_dict() if tripwire else None  # memory after it saved nothing
            return result, None
        if isinstance(failure, LeaseLostError):  # another replica has the run: nothing more here
            return self._stopped("failed", started, error=failure), failure
        if suspended is not None:
            try:
                await self._suspend(suspended)
            except (MemoryStoreError, SuspendError) as exc:
                failure = exc
                self.emit({"type": "error", "payload": {"message": str(exc)}})
                return self._stopped("failed", started, error=exc), exc
            return self._stopped("suspended", started), None
        text = self.text()
        if tripwire is not None:
            finish_reason = "other"
            self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
        else:
            if failure is not None:
                finish_reason = "error"
                self.emit({"type": "error", "payload": {"message": str(failure)}})
            try:
                if not isinstance(failure, RunTimeoutError):  # no budget left for finalization
                    text, tripwire = await steps.output_result(
                        self, text, finish_reason, clean=failure is None
                    )
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                # a stream must say why it failed here too (a turn too large to save, a store
                # gone): the client would otherwise see `finish` and lose the turn unaware
                if failure is None:
                    failure = exc
                    self.emit({"type": "error", "payload": {"message": str(exc)}})
                finish_reason = "error"
            if tripwire is not None:
                finish_reason = "other"
                self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
            else:
                if failure is None and self.options.structured_output is not None:
                    mismatch = None
                    if not self.structured_in_step:  # no answer's step: the run ended on a call
                        self.object, mismatch = await structured.answer(
                            self, text, self.options.structured_output
                        )
                    if mismatch is not None:  # strict: the run fails (a result, not a raise)
                        finish_reason, self.structured_error = "error", mismatch
                        self.emit({"type": "error", "payload": {"message": mismatch}})
                    else:
                        # ``object`` where the reference has it; also as the payload (gRPC's `other`)
                        obj = self.object
                        self.emit({"type": "object-result", "object": obj, "payload": {"object": obj}})
                result_meta = assistant_metadata(self.ml.view(msgs.RESPONSE))
                payload: dict[str, Any] = {"finishReason": finish_reason, "usage": self.usage}
                if result_meta:
                    payload["metadata"] = result_meta
                self.emit({"type": "finish", "payload": payload})
        status = "tripwire" if tripwire else "failed" if failure or self.structured_error else "success"
        result = self._result(text, finish_reason, status, tripwire=tripwire, error=failure)
        result.object = self.object
        result.error = result.error or self.structured_error
        self.metrics.runs.labels(self.agent.id, finish_reason).inc()
        self.metrics.run_duration.labels(self.agent.id).observe(time.perf_counter() - started)
        return result, failure

    def _result(
        self,
        text: str,
        finish_reason: str,
        status: str,
        *,
        tripwire: TripwireAbort | None = None,
        error: BaseException | None = None,
    ) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            text=text,
            finish_reason=finish_reason,
            steps=self.steps,
            tripwire=tripwire.as_dict() if tripwire else None,
            usage=self.usage,
            response_messages=self.ml.view(msgs.RESPONSE),
            violations=self.violations,
            error=str(error) if error else None,
            status=status,
            suspended=self.pending_approvals,
            model_id=self.answered_by,
            used_fallback_value=self.used_fallback_value,
        )

    def _stopped(self, status: str, started: float, error: BaseException | None = None) -> RunResult:
        """The result of a run that stopped before its end: aborted (`caller_abort.finalize` finalized
        it), suspended, or failed while suspending (processOutputResult runs when it really ends)."""
        finish_reason = {"aborted": "abort", "suspended": "suspended"}.get(status, "error")
        self.metrics.runs.labels(self.agent.id, finish_reason).inc()
        self.metrics.run_duration.labels(self.agent.id).observe(time.perf_counter() - started)
        return self._result(self.text(), finish_reason, status, error=error)

    async def _suspend(self, pending: PendingTools) -> None:
        """Keep the run in the store until a decision resumes it; memory gets the turn so far."""
        if self.agent.store is None:
            raise SuspendError(
                f"agent {self.agent.id!r}: a tool call awaits approval or data but the agent has no store "
                "to keep the suspended run (configure `storage`)"
            )
        call = pending.calls[0]
        try:
            store = await self.agent.store()
            await store.save_suspended(snapshot.suspended_run(self, pending), fence=self.fence)
        except FencedWriteError as exc:
            self.fenced("suspension", exc)
            raise
        except MemoryStoreError as exc:
            # the client reads what failed, never where the store is (the log gets the whole error)
            log.error("run %s: saving the suspended run failed: %s", self.run_id, exc)
            raise type(exc)(f"suspending the run failed: {client_message(exc)}") from exc
        if self.memory is not None:
            await self.memory.history.save(self, "suspended")
        awaited = {"toolCallId": call["toolCallId"], "toolName": call["toolName"], "args": call.get("args")}
        if pending.suspension is not None:
            awaited["suspendPayload"] = pending.suspension["payload"]
        self.pending_approvals = [awaited]
        self.emit({"type": "finish", "payload": {"finishReason": "suspended", "usage": self.usage}})

    async def _prepare_and_loop(self) -> LoopEnd:
        if self.resume_from is not None:
            pending, decision = self.resume_from
            return await self._loop(pending, {pending.calls[0]["toolCallId"]: decision})
        if self.resume_step is not None:  # a durable run taken over at a step boundary
            return await self._loop(start=self.resume_step)
        systems, convo = normalize_input(self.input)
        opts = self.options
        instructions = opts.instructions if opts.instructions is not None else self.agent.instructions
        for text in (instructions, *opts.system):
            if text:
                self.system.append(msgs.text_message("system", text))
        self.system.extend(systems)
        answered = structured.for_agent(opts.structured_output)  # not with a structuring model
        if answered is not None:
            self.system.append(msgs.text_message("system", structured.instruction(answered)))
        results: list[dict[str, Any]] = []
        for m in convo:
            if m["role"] == "tool":  # a client tool's result: it settles the call it answers
                results += [p for p in m["content"].get("parts") or [] if p.get("type") == "tool-result"]
            else:
                self.ml.add(m, msgs.INPUT)
        # the call may be in this input or, with a thread, in the history memory loads
        self.unsettled_results = self.ml.settle_tool_calls(results, msgs.INPUT)
        self.first_call = optimistic.start(self)
        try:
            await steps.process_input(self)
            for result in self.unsettled_results:
                log.warning(
                    "agent %s: a tool result for call %r matches no tool call of the conversation; ignored",
                    self.agent.id,
                    result.get("toolCallId"),
                )
            self.loop_system = list(self.system)
            await self._checkpoint(0)
            return await self._loop()
        finally:  # a block before step 0's model call: the early call goes
            if self.first_call is not None:
                await self.first_call.cancel()

    async def _checkpoint(self, next_step: int) -> None:
        """A step boundary: a durable run keeps its snapshot here (`RunCore.checkpoint`)."""
        if self.checkpoint is not None:
            await self.checkpoint(self, next_step)

    async def _loop(
        self,
        pending: PendingTools | None = None,
        decisions: dict[str, Decision] | None = None,
        *,
        start: int = 0,
    ) -> LoopEnd:
        step_number = start
        if pending is not None:  # a resumed run: the suspended step's calls first
            # The resumed stream starts with the calls it answers (a client rebuilding the message
            # from this stream alone needs each tool-call before its result).
            for call in pending.calls:
                self.emit({"type": "tool-call", "payload": dict(call)})
            assistant = self.ml.get(pending.assistant_id)
            record = pending.step_record
            number = pending.step_number
            finish = await self._after_step(assistant, pending.calls, number, record, decisions=decisions)
            if finish is not None:
                return finish
            step_number = pending.step_number + 1
        while True:
            with tracing.span(f"step {step_number}", attributes={"procmesh.step": step_number}) as span:
                finish, again = await self._step(step_number)
                span.set("procmesh.retried", again)
            if finish is not None:
                return finish
            if not again:
                step_number += 1
                await self._checkpoint(step_number)

    async def _step(self, step_number: int) -> tuple[LoopEnd | None, bool]:
        """One model step and its tool work: (how the loop ends when it does, whether the step is
        to run again: a retry)."""
        self.info.step_number = step_number
        self.system = list(self.loop_system)  # processInputStep system changes last one step
        cfg = steps.step_config(
            self, self.agent.model if self.model_index == 0 else self.agent.fallbacks[self.model_index - 1]
        )
        try:
            await steps.input_step(self, cfg)
        except TripwireAbort as abort:
            if abort.retry and retries.may_retry_step(self):
                retries.retry_with_feedback(self, abort.reason)
                return None, True
            raise
        prompt = msgs.build_prompt(self.system, self.ml.items)
        prompt, cached = await steps.llm_request(self, prompt, cfg)
        request = steps.model_request(self, prompt, cfg)
        early, self.first_call = self.first_call, None  # only step 0's call may have started early
        if cached is None:  # what the model is shown: a replay checks its candidate shows the same
            self.record_input("model-prompt", step_number, {"sha256": request.digest()})
        try:
            outcome = await model_step(self, request, cfg, cached.chunks if cached else None, early)
        except APICallError as err:
            self.steps.append(step_record(step_number, StepOutcome(finish_reason="error")))
            if (
                await retries.api_error(self, err)
                or self._fall_back(cfg.model.model_id, err)
                or attachments.give_up(self, err)  # an attachment nobody recovered: its placeholder
            ):
                return None, True
            raise
        self.answered_by = cfg.model.model_id
        if not outcome.from_cache:  # the model's own output, before any processor (an aborted
            # step's too, as far as it streamed): what a replay answers this step with
            self.record_input("model-output", step_number, outcome.raw_chunks)
        if outcome.abort is not None:
            if outcome.text:
                self.ml.add(assistant_message(outcome.text, []), msgs.RESPONSE)
            raise self.aborted(outcome.abort)
        self._add_usage(outcome.usage)
        await steps.llm_response(self, outcome, cfg.model.model_id)
        try:
            await steps.output_step(self, outcome)
            if not outcome.tool_calls:
                await self._structure_answer(outcome.text)
        except TripwireAbort as abort:
            self.steps.append(step_record(step_number, outcome, tripwire=abort))
            if abort.retry and retries.may_retry_step(self):
                retries.retry_with_feedback(self, abort.reason)
                return None, True
            self.ml.add(assistant_message(outcome.text, []), msgs.RESPONSE)
            raise
        assistant = assistant_message(outcome.text, outcome.tool_calls, outcome.reasoning_parts())
        self.ml.add(assistant, msgs.RESPONSE)
        self.current_step = None  # the step's text is in its message: an abort in its tools keeps it once
        recorded = cached.tool_results if cached else []
        record = step_record(step_number, outcome)
        return await self._after_step(assistant, outcome.tool_calls, step_number, record, recorded), False

    async def _structure_answer(self, text: str) -> None:
        """With a structuring model, the answer's step is structured once its processOutputStep
        passed, as the reference's structured-output processor (last in the output lane) does: a
        strict failure is that processor's abort with retry, so under maxProcessorRetries the step
        runs again with the failure as feedback; past them (or without) the run ends in a tripwire."""
        so = self.options.structured_output
        if so is None or so.model is None or so.model not in self.agent.models:
            return  # an unknown structuring model fails the run at its end, naming it
        value, error = await structured.answer(self, text, so)
        if error is not None:
            raise self.aborted(structured.step_abort(error))
        self.object, self.structured_in_step = value, True

    async def _after_step(
        self,
        assistant: dict[str, Any],
        calls: list[dict[str, Any]],
        step_number: int,
        record: dict[str, Any],
        recorded: list[dict[str, Any]] | None = None,
        decisions: dict[str, Decision] | None = None,
    ) -> LoopEnd | None:
        """The step's tool work, then whether the loop ends (`LoopEnd`), or None to go on."""
        if calls:
            results, left, suspension = await run_tools(
                self, assistant, calls, step_number, recorded or (), decisions
            )
            record["toolResults"] = [*record["toolResults"], *results]
            if left:  # a call awaits a decision: the step is not over, so it is not in self.steps
                return PendingTools(assistant["id"], left, step_number, record, suspension)
        self.steps.append(record)
        self.info.retry_count = 0
        finish_reason = str(record["finishReason"])
        if not calls or self.awaiting_client:
            return finish_reason
        if step_number + 1 >= self.max_steps or should_stop(self.stop_when, self.steps):
            return finish_reason
        return None

    def _fall_back(self, failed: str, err: APICallError) -> bool:
        """The error processors did not recover the call: the next model gets its turn (the
        seeds, end of the API-error section), with its own retries and error-processor budget."""
        if self.model_index >= len(self.agent.fallbacks):
            return False
        self.model_index += 1
        following = self.agent.fallbacks[self.model_index - 1].model_id
        self.info.retry_count = 0
        self.metrics.model_fallbacks.labels(self.agent.id, failed, following).inc()
        log.warning(
            "agent %s: model %s failed (%s); falling back to %s", self.agent.id, failed, err, following
        )
        return True

    def _add_usage(self, usage: dict[str, int]) -> None:
        for key in self.usage:
            self.usage[key] += int(usage.get(key) or 0)
