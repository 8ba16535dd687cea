"""A fake `HookCaller` and a fake model: the run loop without sockets, gRPC or protobuf."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.errors import APICallError, ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import Agent, AgentSpec, Lanes, context
from procmesh_orchestrator.run.hooks import Chunk, Effects, HookArgs, Processor, Reply, RunInfo, StreamItem
from procmesh_orchestrator.run.models import ModelRequest

Answer = Callable[[HookArgs[Any], RunInfo], Reply[Any]]
"""A fake processor's answer to one hook call."""
StreamAnswer = Callable[[Chunk], list[StreamItem] | None]
"""A fake processor's answer to one stream part: what goes on in its place (None: the part as it came)."""


@dataclass(frozen=True)
class FakeProcessor:
    """A lane entry that answers from functions instead of a sidecar."""

    key: str
    answers: dict[str, Answer] = field(default_factory=dict)
    stream_answer: StreamAnswer | None = None
    fail_closed: bool = True

    def has(self, hook: str) -> bool:
        return hook in self.answers or (hook == "process_output_stream" and self.stream_answer is not None)

    def expand(self, request_context: Mapping[str, Any]) -> tuple[FakeProcessor, ...]:
        return (self,)


def abort(processor: str, reason: str, *, retry: bool = False, hook: str = "") -> TripwireAbort:
    return TripwireAbort(processor, reason, retry, None, hook)


@dataclass
class Call:
    processor: str
    args: HookArgs[Any]
    step_number: int
    retry_count: int


class FakeCaller:
    """Records every call and answers with each fake processor's functions."""

    def __init__(self, info: RunInfo, metrics: OrchestratorMetrics, log: list[Call]) -> None:
        self.info = info
        self.log = log

    async def call(self, item: Processor, args: HookArgs[Any]) -> Reply[Any]:
        assert isinstance(item, FakeProcessor)
        self.log.append(Call(item.key, args, self.info.step_number, self.info.retry_count))
        answer = item.answers[args.hook](args, self.info)
        if answer.result is not None and answer.effects.context:  # applied as the gRPC caller does
            refused = context.accept(self.info, answer.effects.context)
            if refused is not None:
                self.fail(item, args.hook, refused)
                return Reply(None)
        return answer

    def fail(self, item: Processor, hook: str, cause: str) -> None:
        assert isinstance(item, FakeProcessor)
        if item.fail_closed:
            raise ProcessorFailedError(item.key, hook, cause)

    def export_states(self) -> dict[str, Any]:
        return {pid: dict(state) for pid, state in self.info.states.items() if isinstance(state, dict)}

    def import_states(self, states: dict[str, Any]) -> None:
        self.info.states.update(states)

    async def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        stages = [p for p in lane if isinstance(p, FakeProcessor) and p.stream_answer is not None]
        async for chunk in source:
            items: list[StreamItem] = [chunk]
            for stage in stages:
                assert stage.stream_answer is not None
                out: list[StreamItem] = []
                for item in items:
                    if isinstance(item, dict):
                        answer = stage.stream_answer(item)
                        out.extend([item] if answer is None else answer)
                    else:
                        out.append(item)
                items = out
            for item in items:
                yield item
                if isinstance(item, TripwireAbort):
                    return


class FakeModel:
    """Streams scripted responses: text, tool calls, or an APICallError; records each request."""

    def __init__(self, *responses: dict[str, Any], model_id: str = "fake") -> None:
        self.model_id = model_id
        self.responses = list(responses)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        spec = self.responses.pop(0) if self.responses else {"text": "(exhausted)"}
        if "error" in spec:
            raise APICallError(spec["error"], status=500, retryable=True)
        for word in spec.get("text", "").split(" "):
            if word:
                yield {"type": "text-delta", "payload": {"id": "t0", "text": word + " "}}
        calls = spec.get("tool_calls", [])
        for i, name in enumerate(calls):
            yield {"type": "tool-call", "payload": {"toolCallId": f"c{i}", "toolName": name, "args": {}}}
        reason = "tool-calls" if calls else "stop"
        usage = {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}
        yield {"type": "finish", "payload": {"finishReason": reason, "usage": usage}}


def agent(
    model: FakeModel,
    log: list[Call],
    *,
    input: tuple[FakeProcessor, ...] = (),
    output: tuple[FakeProcessor, ...] = (),
    error: tuple[FakeProcessor, ...] = (),
    **spec: Any,
) -> Agent:
    def factory(info: RunInfo, metrics: OrchestratorMetrics) -> FakeCaller:
        return FakeCaller(info, metrics, log)

    return Agent(
        AgentSpec(id="a", model=model, hook_caller=factory, lanes=Lanes(input, output, error), **spec)
    )


def reply(result: Any = None, **effects: Any) -> Reply[Any]:
    return Reply(result, Effects(**effects))
