"""The hooks of preparation, of each step and of finalization, in lane order (SPEC §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.errors import TripwireAbort
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import structured
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import (
    Chunk,
    Effects,
    InputArgs,
    InputResult,
    InputStepArgs,
    InputStepResult,
    LLMRequestArgs,
    LLMRequestResult,
    LLMResponseArgs,
    LLMResponseResult,
    MessagesResult,
    OutputResultArgs,
    OutputStepArgs,
    Processor,
    dedupe,
)
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest, specification_version
from procmesh_orchestrator.run.speculation import walk
from procmesh_orchestrator.run.text_pieces import Pieces
from procmesh_orchestrator.run.tools import ProcessorTool
from procmesh_orchestrator.run.tools import spec as tool_spec


@dataclass
class StepOutcome:
    """What one model step produced, after the output-stream processors."""

    texts: Pieces = field(default_factory=Pieces)
    """Its text deltas (`text`)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    raw_chunks: list[Chunk] = field(default_factory=list)
    """The model's chunks as they came, kept only when read: by the input lane's processLLMResponse
    processors (`llm_response`) or the run's recording (``recordInputs``); empty otherwise."""
    abort: TripwireAbort | None = None
    from_cache: bool = False
    sources: list[dict[str, Any]] = field(default_factory=list)
    """The sources the model cited (``source`` chunks' payloads: ``{id, sourceType, url, title}``)."""
    reasoning: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The model's reasoning blocks by id, in order: ``{text: Pieces, providerMetadata}``
    (`reasoning_blocks`)."""
    warnings: list[dict[str, Any]] = field(default_factory=list)
    """The call's warnings: settings the model's API has no field for (`models.setting_warnings`)."""

    @property
    def text(self) -> str:
        """Its text, the text deltas joined."""
        return str(self.texts)

    def reasoning_blocks(self) -> list[dict[str, Any]]:
        """The reasoning blocks with text, in order: ``{id, text, providerMetadata?}``."""
        blocks = []
        for rid, block in self.reasoning.items():
            text = str(block["text"])
            if text:
                blocks.append({"id": rid, **block, "text": text})
        return blocks

    def finished(self, chunk: Chunk) -> bool:
        """Whether `chunk` is the model's finish (its reason and usage are the step's now): the
        output stream gets `step_finish` in its place, last."""
        if chunk["type"] != "finish":
            return False
        payload = chunk.get("payload") or {}
        self.finish_reason = payload.get("finishReason", "stop")
        self.usage = payload.get("usage") or {}
        return True

    def step_finish(self) -> Chunk:
        """The step's end as the output stream gets it (a processor holding parts lets them go)."""
        return {"type": "step-finish", "payload": {"finishReason": self.finish_reason, "usage": self.usage}}

    def reasoning_parts(self) -> list[dict[str, Any]]:
        """The reasoning as the assistant message's parts (a signature in `providerMetadata`)."""
        return [
            {"type": "reasoning", "text": r["text"], "providerMetadata": r.get("providerMetadata") or {}}
            for r in self.reasoning_blocks()
        ]


@dataclass
class CachedStep:
    """A step a processor's processLLMRequest replays instead of calling the model (a cache hit)."""

    chunks: list[Chunk]
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    """Its tool calls' recorded results: replayed, the tools are not run again (`run_tools`)."""


@dataclass
class StepConfig:
    """A step's model settings, as processInputStep may change them."""

    model: ModelProvider
    tools: list[dict[str, Any]]
    tool_choice: Any
    active_tools: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    model_settings: dict[str, Any] = field(default_factory=dict)


def step_config(run: RunCore, model: ModelProvider) -> StepConfig:
    """A step's settings before processInputStep: the call's options, the run's offered tools."""
    opts = run.options
    offered = [tool_spec(t) for t in run.offered_tools()]
    return StepConfig(
        model=model,
        tools=offered,
        tool_choice=opts.tool_choice if opts.tool_choice is not None else "auto" if offered else None,
        active_tools=list(opts.active_tools) if opts.active_tools is not None else None,
        model_settings=dict(opts.model_settings or {}),
    )


def model_request(run: RunCore, prompt: list[dict[str, Any]], cfg: StepConfig) -> ModelRequest:
    """The provider call of a step with this prompt and these settings."""
    tools = cfg.tools
    if cfg.active_tools is not None:
        tools = [t for t in tools if t["name"] in cfg.active_tools]
    answered = structured.for_agent(run.options.structured_output)
    tools = structured.offered_tools(tools, cfg.tool_choice, answered)
    return ModelRequest(
        prompt=prompt,
        tools=tools,
        tool_choice=cfg.tool_choice if tools else None,
        streaming=run.streaming,
        provider_options=cfg.provider_options,
        model_settings=cfg.model_settings,
        response_format=structured.response_format(answered) if answered is not None else None,
    )


async def process_input(run: RunCore) -> None:
    """processInput, input lane in order (its chunks are not streamed: the stream has not begun)."""

    def build(item: Processor) -> InputArgs:
        # With memory, processInput is given the loaded history followed by the new input (SPEC §2).
        return InputArgs(run.ml.view(msgs.MEMORY, msgs.INPUT), run.ml.view(), list(run.system))

    async def apply(item: Processor, args: InputArgs, result: InputResult, effects: Effects) -> bool:
        if effects.abort is None:
            before = args.messages
            if result.all_messages is not None:
                run.system.extend(run.ml.replace_all(result.all_messages, msgs.INPUT))
                before = run.ml.view(msgs.MEMORY, msgs.INPUT)
            if result.system_messages is not None:
                run.system = result.system_messages
            if result.messages is not None:
                run.system.extend(run.ml.apply(before, result.messages, msgs.INPUT))
        await run.apply(effects, can_stream=False)
        return False

    await walk(run, run.input_lane, "process_input", build, apply)


async def input_step(run: RunCore, cfg: StepConfig) -> None:
    """processInputStep, input lane in order: it may change the step's messages, model and tools."""

    def build(item: Processor) -> InputStepArgs:
        return InputStepArgs(
            model=cfg.model.model_id,
            messages=run.ml.view(),
            system_messages=list(run.system),
            tools=cfg.tools,
            tool_choice=cfg.tool_choice,
            active_tools=cfg.active_tools,
            provider_options=cfg.provider_options,
            model_settings=cfg.model_settings,
            steps=run.steps,
        )

    async def apply(item: Processor, args: InputStepArgs, result: InputStepResult, effects: Effects) -> bool:
        if effects.abort is None:
            _step_overrides(run, result, cfg, args.messages, item)
        await run.apply(effects)
        return False

    await walk(run, run.input_lane, "process_input_step", build, apply)


def _step_overrides(
    run: RunCore, result: InputStepResult, cfg: StepConfig, before: list[dict[str, Any]], item: Processor
) -> None:
    if result.messages is not None:
        run.system.extend(run.ml.apply(before, result.messages, msgs.INPUT))
    if result.system_messages is not None:
        run.system = result.system_messages
    if result.model is not None:
        model = run.agent.models.get(result.model)
        if model is None:  # a malformed response: the processor's failure policy decides
            run.caller.fail(
                item,
                "process_input_step",
                f"returned unknown model {result.model!r} (configured: {sorted(run.agent.models)}, "
                "or provider/model-id)",
            )
        else:
            cfg.model = model
    if result.tools is not None:
        # tools the run does not have are run by the processor that added them, if it can
        if item.has("execute_tool"):
            for tool in result.tools:
                if tool["name"] not in run.tools:
                    run.tools[tool["name"]] = ProcessorTool(
                        tool["name"], tool.get("description", ""), tool.get("inputSchema") or {}, item
                    )
        cfg.tools = result.tools
    if result.tool_choice is not None:
        cfg.tool_choice = result.tool_choice
    if result.active_tools is not None:
        cfg.active_tools = result.active_tools
    if result.provider_options is not None:
        cfg.provider_options = result.provider_options
    if result.model_settings is not None:
        cfg.model_settings = result.model_settings


async def llm_request(
    run: RunCore, prompt: list[dict[str, Any]], cfg: StepConfig
) -> tuple[list[dict[str, Any]], CachedStep | None]:
    """processLLMRequest: input lane, then error lane (once each); the first cached response wins."""
    cached: CachedStep | None = None

    def build(item: Processor) -> LLMRequestArgs:
        return LLMRequestArgs(cfg.model.model_id, prompt, run.steps, specification_version(cfg.model))

    async def apply(
        item: Processor, args: LLMRequestArgs, result: LLMRequestResult, effects: Effects
    ) -> bool:
        nonlocal prompt, cached
        if effects.abort is None:
            if result.prompt is not None:
                prompt = result.prompt
            if result.cached_response is not None and cached is None:
                cached = CachedStep(result.cached_response, result.cached_tool_results)
        await run.apply(effects)
        return False

    await walk(run, dedupe([*run.input_lane, *run.error_lane]), "process_llm_request", build, apply)
    return prompt, cached


async def llm_response(run: RunCore, outcome: StepOutcome, model_id: str) -> None:
    """processLLMResponse, input lane in order: the step's raw chunks, for effects only.

    A processor may ask to see the run's final result (`LLMResponseResult.output_result_if_clean`);
    `output_result` calls it at the run's clean end.
    """

    def build(item: Processor) -> LLMResponseArgs:
        return LLMResponseArgs(model_id, outcome.from_cache, outcome.raw_chunks, run.steps)

    async def apply(
        item: Processor, args: LLMResponseArgs, result: LLMResponseResult, effects: Effects
    ) -> bool:
        waiting = {i.key for i in run.at_clean_end}
        if effects.abort is None and result.output_result_if_clean and item.key not in waiting:
            run.at_clean_end.append(item)
        await run.apply(effects)
        return False

    await walk(run, run.input_lane, "process_llm_response", build, apply)


async def output_step(run: RunCore, outcome: StepOutcome) -> None:
    """processOutputStep, output lane in order: the step's messages may be replaced."""

    def build(item: Processor) -> OutputStepArgs:
        return OutputStepArgs(
            text=outcome.text,
            finish_reason=outcome.finish_reason,
            messages=run.ml.view(),
            system_messages=list(run.system),
            tool_calls=outcome.tool_calls,
            usage=outcome.usage,
            steps=run.steps,
        )

    async def apply(item: Processor, args: OutputStepArgs, result: MessagesResult, effects: Effects) -> bool:
        if effects.abort is None and result.messages is not None:
            run.system.extend(run.ml.apply(args.messages, result.messages, msgs.RESPONSE))
        await run.apply(effects)
        return False

    await walk(run, run.output_lane, "process_output_step", build, apply)


async def output_result(
    run: RunCore, text: str, finish_reason: str, *, clean: bool
) -> tuple[str, TripwireAbort | None]:
    """processOutputResult once per request, output lane in order; an abort blanks the text.

    The processors that asked for it in processLLMResponse (`run.at_clean_end`) get theirs last,
    whatever their lane, and only in a `clean` run (nothing failed) that no processOutputResult
    aborted: they act on the run's final, accepted result (response-cache writes it then).
    """
    late = {item.key for item in run.at_clean_end}
    text, abort = await _output_result(
        run, [i for i in run.output_lane if i.key not in late], text, finish_reason
    )
    if abort is not None or not clean or not run.at_clean_end:
        return text, abort
    return await _output_result(run, run.at_clean_end, text, finish_reason)


async def _output_result(
    run: RunCore, lane: Sequence[Processor], text: str, finish_reason: str
) -> tuple[str, TripwireAbort | None]:
    def build(item: Processor) -> OutputResultArgs:
        return OutputResultArgs(run.ml.view(msgs.RESPONSE), text, finish_reason, run.usage, run.steps)

    async def apply(
        item: Processor, args: OutputResultArgs, result: MessagesResult, effects: Effects
    ) -> bool:
        nonlocal text
        if effects.abort is None and result.messages is not None:
            run.ml.apply(args.messages, result.messages, msgs.RESPONSE)
            text = run.text()
        await run.apply(effects)
        return False

    try:
        await walk(run, lane, "process_output_result", build, apply)
    except TripwireAbort as abort:
        return "", abort
    return text, None
