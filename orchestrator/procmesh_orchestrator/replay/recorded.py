"""The model and the tools of a replayed run, answered from its record: no model or tool is called.

`RecordedModel` answers the run's Nth model call with the Nth recorded raw output, after checking
the candidate shows the model what the recorded run showed it (the prompt hash,
`ModelRequest.digest`); otherwise the recorded answer no longer applies and the replay of the run
stops there (`ReplayStopped`) rather than pretend. `RecordedTool` answers a tool call with its
recorded result, `RecordedCaller` a tool a processor added to a step and would run itself
(ExecuteTool), and `RecordedModels` a processor's switch to another model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.replay.source import RecordedRun
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import (
    ExecuteToolArgs,
    ExecuteToolResult,
    HookArgs,
    HookCaller,
    Reply,
    RunInfo,
)
from procmesh_orchestrator.run.models import Chunk, ModelProvider, ModelRequest
from procmesh_orchestrator.run.tools import Tool, ToolCall, ToolOutcome, Writer

_OTHER_PROMPT = "the candidate shows the model another prompt than the recorded run did"
_THREAD = (
    " (the recorded run's memory thread, whose history its prompt held, is not replayed: its"
    " recording kept no memory-context)"
)


class ReplayStopped(Exception):
    """The record cannot answer the candidate's run from `step` on; `reason` says why."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step}: {reason}")
        self.step = step
        self.reason = reason


class RecordedModel:
    """A `ModelProvider` answering each call with the recorded run's output of that call."""

    def __init__(self, run: RecordedRun, model_id: str) -> None:
        self.model_id = model_id
        self.run = run
        self.calls = 0
        self.stopped: ReplayStopped | None = None
        """Why the replay stopped, when it did (kept: the run may wrap what the stream raised)."""
        self.info: RunInfo | None = None
        """The candidate's run (its step number: a retry runs a step again, so the recorded call's
        step may not be the candidate's)."""

    def stop_at(self, step: int, reason: str) -> ReplayStopped:
        """Stop the replay of the run at `step` (the first stop is the one reported)."""
        self.stopped = self.stopped or ReplayStopped(step, reason)
        return self.stopped

    def tool_answer(self, step: int, call_id: str, name: str | None, args: Any) -> dict[str, Any]:
        """The recorded answer of a tool call (same id, tool and arguments: `RecordedRun.tool_results`),
        or ReplayStopped."""
        recorded = self.run.tool_results.get(call_id)
        if recorded is None or (name is not None and recorded.get("toolName") != name):
            raise self.stop_at(
                step, f"no recorded result of tool call {call_id!r} ({name or 'a processor tool'})"
            )
        if recorded.get("args") != args:
            raise self.stop_at(step, f"tool call {call_id!r} ({name}): other arguments than recorded")
        return recorded

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """The recorded raw chunks of this call; ReplayStopped when the record has none or the
        candidate's prompt differs from the recorded one."""
        index, self.calls = self.calls, self.calls + 1
        if index >= len(self.run.outputs):
            step = self.info.step_number if self.info is not None else len(self.run.outputs)
            cut = " (the recording was truncated at decisions.maxInputBytes)" if self.run.truncated else ""
            raise self.stop_at(
                step, f"the recorded run made no model call {index + 1}: nothing answers it{cut}"
            )
        recorded_step, chunks = self.run.outputs[index]
        step = recorded_step if self.info is None else self.info.step_number
        recorded = self.run.prompts[index][1] if index < len(self.run.prompts) else ""
        if recorded != request.digest():
            why = _OTHER_PROMPT + (_THREAD if self.run.thread_id and self.run.memory is None else "")
            raise self.stop_at(step, f"recorded model output no longer applies from step {step}: {why}")
        for chunk in chunks:
            yield chunk
        if not chunks or chunks[-1].get("type") != "finish":
            raise self.stop_at(
                step, "the recorded model output ends here (the recorded run stopped reading it)"
            )


@dataclass(frozen=True)
class RecordedTool:
    """A tool of the candidate's agent as the model sees it, its calls answered with the recorded
    results (`of` copies what the model is shown of the agent's tool)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    requires_approval: bool
    model: RecordedModel
    """Where a call the record cannot answer stops the replay (`RecordedModel.stopped`)."""

    @classmethod
    def of(cls, tool: Tool, model: RecordedModel) -> RecordedTool:
        """`tool`, answered from `model`'s run's record."""
        return cls(tool.name, tool.description, tool.input_schema, tool.requires_approval, model)

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome | None:
        """The recorded result of this call (same id, tool and arguments), or ReplayStopped."""
        answer = self.model.tool_answer(run.info.step_number, call.call_id, call.name, call.args)
        return ToolOutcome(answer.get("result"), answer.get("error"), model_output=answer.get("modelOutput"))


class RecordedCaller:
    """A run's hook caller whose ExecuteTool calls (a tool a processor added to a step and runs
    itself) are answered from the record; every other hook goes to the real sidecar."""

    def __init__(self, caller: HookCaller, model: RecordedModel) -> None:
        self._caller = caller
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._caller, name)

    async def call(self, item: Any, args: HookArgs[Any]) -> Reply[Any]:
        """The recorded result for ExecuteTool, else the sidecar's answer."""
        if isinstance(args, ExecuteToolArgs):
            step = self._model.info.step_number if self._model.info is not None else 0
            answer = self._model.tool_answer(step, args.tool_call_id, None, args.args)
            return Reply(
                ExecuteToolResult(answer.get("result"), answer.get("error"), answer.get("modelOutput"))
            )
        return await self._caller.call(item, args)


class RecordedModels(dict[str, ModelProvider]):
    """The agent's models by reference, each the recorded model: a processor's switch to another
    model resolves as in a live run (a reference the candidate cannot resolve fails alike) and
    calls nothing."""

    def __init__(self, models: Mapping[str, ModelProvider], model: RecordedModel) -> None:
        super().__init__({ref: model for ref in models})
        self._models = models
        self._model = model

    def __missing__(self, ref: str) -> ModelProvider:
        self._models[ref]  # KeyError as the candidate's registry raises it
        return self._model

    def get(self, ref: str, default: ModelProvider | None = None) -> ModelProvider | None:  # type: ignore[override]
        """The recorded model for a reference the candidate resolves, else `default`."""
        return self._model if self._models.get(ref) is not None else default
