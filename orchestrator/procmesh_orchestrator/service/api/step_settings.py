"""The step settings a call gives in the reference's JSON (the HTTP body, and the gRPC request's
option fields as JSON): model settings, tool choice, system texts, and ``prepareSteps``, the
declarative form of the reference's prepareStep function (SEED-GAPS B28), which JSON cannot
carry: ``[{when: {stepNumber: N} | {fromStepNumber: N}, override: {model, toolChoice,
activeTools, system, providerOptions, modelSettings}}]``. Every unknown key is refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from procmesh_orchestrator.run.framework.prepare_step import StepOverride, StepRule
from procmesh_orchestrator.service._errors import BadRequestError


class _ModelTimeout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total_ms: int | None = Field(default=None, ge=0, alias="totalMs")
    step_ms: int | None = Field(default=None, ge=0, alias="stepMs")
    first_chunk_ms: int | None = Field(default=None, ge=0, alias="firstChunkMs")


IGNORED_SETTINGS = {
    "headers": "procmesh does not forward a caller's headers to model providers",
    "reasoning": "procmesh sends no reasoning level to model providers",
    "timeout": "procmesh bounds model calls by the providers' configured timeouts",
}
"""The reference's model settings procmesh accepts but does not apply, and why: a call naming one
runs, with a warning in its result and ``procmesh_call_settings_ignored_total{setting}``."""


IGNORED_OPTIONS = {
    "context": "procmesh takes the conversation in messages (and memory), not as extra context",
    "savePerStep": "procmesh saves a thread's turn once, when the run ends",
    "versions": "procmesh has no stored agent versions: the agent is the configured one",
    "toolsets": "procmesh runs the agent's configured tools and the call's clientTools",
    "scorers": "procmesh runs no scorers",
    "returnScorerData": "procmesh runs no scorers",
    "tracingOptions": "procmesh continues the caller's W3C traceparent header instead",
    "untilIdle": "procmesh ends a generate call with its run",
    "memory.thread.title": "procmesh creates a thread with its id alone (the memory API renames it)",
    "memory.thread.metadata": "procmesh creates a thread with its id alone (the memory API sets it)",
    "memory.thread": "the agent has no memory: the thread is neither loaded nor saved (hooks see its id)",
    "memory.options": "the agent has no memory: the call's memory options apply to nothing",
    "memory.options.semanticRecall": "the agent's memory has no semanticRecall (no embedder): nothing is "
    "recalled, only its message history loaded",
    "structuredOutput.fallbackValue": "used only with errorStrategy: fallback (a mismatch fails the run "
    "with strict, and is reported with warn)",
}
"""The reference server's generate / stream body keys procmesh accepts but does not apply, and
why; a key neither side knows is ignored the same way (``other``): the call runs, with a warning
naming the key in its result and ``procmesh_call_settings_ignored_total{setting}`` (the reference
server passes unknown keys through, and @mastra/client-js sends every option its caller gives).
``memory.thread`` and ``memory.options`` are the call's thread (``threadId`` or ``memory.thread``)
and memory options (``memory.options``, ``memory.readOnly``; gRPC ``thread_id``,
``memory_options``) given to an agent without memory (`AgentCall.note_memoryless`): the reference
runs such a call too, with a log line that they "will not work". ``memory.options.semanticRecall``
is a call's ``semanticRecall: true`` for an agent whose memory configures no semantic recall: the
reference's per-call option turns recall on over the memory's own vector store and embedder, and
procmesh's agent has none to turn on."""

IGNORED_CLIENT_TOOL_KEYS = {
    "outputSchema": "procmesh does not check a client tool's result against a schema (the client runs it)",
    "strict": "procmesh sends no provider strict mode for a tool's schema",
    "providerOptions": "procmesh sends no per-tool provider options",
    "inputExamples": "procmesh shows the model no input examples of a tool",
    "background": "a client tool runs in the client, never in procmesh's background",
    "suspendSchema": "a client tool suspends in the client, not in procmesh",
    "resumeSchema": "a client tool suspends in the client, not in procmesh",
    "requestContextSchema": "procmesh checks the request context with the agent's requestContextSchema",
    "mcp": "a client tool is the caller's, not an MCP server's",
    "mcpMetadata": "a client tool is the caller's, not an MCP server's",
}
"""The keys of a ``clientTools`` entry procmesh accepts but does not apply (@mastra/client-js sends
a ``createTool`` object's fields as they are; functions do not survive JSON), and why: the call
runs, with a warning naming ``clientTools.NAME.KEY`` and the counter's ``clientTools.KEY`` (any
other key: ``other``). Taken: ``id`` (the entry's key names the tool), ``description``,
``inputSchema`` / ``parameters`` and ``requireApproval``."""


class ModelSettingsBody(BaseModel):
    """``modelSettings``: what the providers send, ``maxRetries`` (the provider's retries of this
    call's model calls) and the reference's settings procmesh ignores with a warning
    (`IGNORED_SETTINGS`); any other key is refused, never ignored."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=1, alias="maxOutputTokens")
    top_p: float | None = Field(default=None, ge=0, le=1, alias="topP")
    top_k: int | None = Field(default=None, ge=1, alias="topK")
    presence_penalty: float | None = Field(default=None, alias="presencePenalty")
    frequency_penalty: float | None = Field(default=None, alias="frequencyPenalty")
    stop_sequences: list[str] | None = Field(default=None, alias="stopSequences")
    seed: int | None = None
    max_retries: int | None = Field(default=None, ge=0, le=100, alias="maxRetries")
    headers: dict[str, str | None] | None = None
    reasoning: str | None = None
    timeout: _ModelTimeout | None = None

    def wire(self) -> dict[str, Any]:
        """The settings applied, by their camelCase names (what `StepConfig.model_settings` holds)."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude=set(IGNORED_SETTINGS))

    def ignored(self) -> list[str]:
        """The settings given that procmesh does not apply (`IGNORED_SETTINGS`)."""
        return [name for name in IGNORED_SETTINGS if getattr(self, name) is not None]


class ToolChoiceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["tool"]
    tool_name: str = Field(alias="toolName", min_length=1)


def system_texts(value: Any, field: str) -> list[str] | None:
    """``instructions`` / ``system`` as texts: a string, a system message ``{role, content}``
    (content a string or text parts), or a list of those; None when not given."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for i, item in enumerate(items):
        where = f"{field}.{i}" if isinstance(value, list) else field
        if isinstance(item, str):
            out.append(item)
            continue
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
        ):
            out.append("".join(p["text"] for p in content))
        else:
            raise BadRequestError(f"{where}: must be a string or a system message {{role, content}}")
    return out


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceBody


def tool_choice(value: ToolChoice | None) -> Any:
    """A validated tool choice as the run takes it (``{"type": "tool", "toolName"}`` for one tool)."""
    if isinstance(value, ToolChoiceBody):
        return {"type": "tool", "toolName": value.tool_name}
    return value


class _When(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step_number: StrictInt | None = Field(default=None, alias="stepNumber", ge=0)
    from_step_number: StrictInt | None = Field(default=None, alias="fromStepNumber", ge=0)


class _Override(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, min_length=1)
    tool_choice: ToolChoice | None = Field(default=None, alias="toolChoice")
    active_tools: list[str] | None = Field(default=None, alias="activeTools")
    system: Any = None
    provider_options: dict[str, dict[str, Any]] | None = Field(default=None, alias="providerOptions")
    model_settings: ModelSettingsBody | None = Field(default=None, alias="modelSettings")


class PrepareStepBody(BaseModel):
    """One ``prepareSteps`` entry: when it applies, and what that step changes."""

    model_config = ConfigDict(extra="forbid")

    when: _When
    override: _Override


def step_rules(entries: list[PrepareStepBody] | None) -> tuple[StepRule, ...]:
    """``prepareSteps`` as the run's `StepRule`s; a 400 naming the entry when one cannot apply."""
    rules = []
    for i, entry in enumerate(entries or ()):
        when, given = entry.when, entry.override
        if (when.step_number is None) == (when.from_step_number is None):
            raise BadRequestError(f"prepareSteps.{i}.when: give one of stepNumber and fromStepNumber")
        settings = given.model_settings
        if settings is not None and settings.ignored():
            raise BadRequestError(
                f"prepareSteps.{i}.override.modelSettings: {settings.ignored()} cannot change per step"
            )
        override = StepOverride(
            model=given.model,
            tool_choice=tool_choice(given.tool_choice),
            active_tools=given.active_tools,
            system=system_texts(given.system, f"prepareSteps.{i}.override.system"),
            provider_options=given.provider_options,
            model_settings=None if settings is None else settings.wire(),
        )
        if override == StepOverride():
            raise BadRequestError(f"prepareSteps.{i}.override: it changes nothing")
        rules.append(StepRule(override, when.step_number, when.from_step_number))
    return tuple(rules)
