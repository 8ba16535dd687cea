"""The call options both APIs take by the reference's names (`StepOptions`: the HTTP body's keys,
the gRPC request's option fields as JSON), validated and turned into `CallOptions` fields once
(`step_kwargs`, `lane_ids`, `client_tools`), and `validated`, the one 400 for a pydantic shape."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from procmesh_orchestrator.run.tools import ClientTool
from procmesh_orchestrator.run.types import StructuredOutput
from procmesh_orchestrator.service._errors import BadRequestError, NotSupportedError
from procmesh_orchestrator.service.api.step_settings import (
    ModelSettingsBody,
    PrepareStepBody,
    ToolChoice,
    step_rules,
    system_texts,
    tool_choice,
)
from procmesh_orchestrator.store import label


class _StructuredOutputBody(BaseModel):
    """``structuredOutput``: a JSON schema, what a mismatch does, an optional structuring model, and
    the keys the reference server takes; any other (``providerOptions``, ``useAgent``: options
    the reference's server does not take either) is refused by name."""

    model_config = ConfigDict(extra="forbid")

    schema_: dict[str, Any] = Field(alias="schema")
    error_strategy: Literal["strict", "warn", "fallback"] = Field(default="strict", alias="errorStrategy")
    fallback_value: Any = Field(default=None, alias="fallbackValue")
    instructions: str | None = None
    model: Any = None
    json_prompt_injection: StrictBool = Field(default=False, alias="jsonPromptInjection")

    def ignored(self) -> list[str]:
        """A ``fallbackValue`` with another `error_strategy` (it is never used): the reference
        takes it too, so the call runs with a warning naming it (`IGNORED_OPTIONS`)."""
        given = "fallback_value" in self.model_fields_set and self.error_strategy != "fallback"
        return ["structuredOutput.fallbackValue"] if given else []


class StepOptions(BaseModel):
    """The options both APIs take by the reference's names: the HTTP body's keys, and the gRPC
    request's option fields as JSON (`_proto_options`), so they are validated and turned into
    `CallOptions` in one place (`step_kwargs`, `lane_ids`)."""

    model_config = ConfigDict(extra="ignore")

    instructions: Any = None
    """Replaces the agent's instructions: a string, a list of strings or system messages."""
    system: Any = None
    """System messages added after the instructions (the same forms)."""
    model_settings: ModelSettingsBody | None = Field(default=None, alias="modelSettings")
    tool_choice: ToolChoice | None = Field(default=None, alias="toolChoice")
    active_tools: list[str] | None = Field(default=None, alias="activeTools")
    structured_output: _StructuredOutputBody | None = Field(default=None, alias="structuredOutput")
    input_processors: list[Any] | None = Field(default=None, alias="inputProcessors")
    """Replaces the agent's lanes for this call: processor ids (`Lanes`)."""
    output_processors: list[Any] | None = Field(default=None, alias="outputProcessors")
    error_processors: list[Any] | None = Field(default=None, alias="errorProcessors")
    prepare_steps: list[PrepareStepBody] | None = Field(default=None, alias="prepareSteps")
    """The reference's prepareStep as data (`step_settings.step_rules`)."""


def client_tools(tools: dict[str, Any], field: str = "clientTools") -> list[ClientTool]:
    """``clientTools`` as ClientTools; a 400 naming the tool when one is malformed."""
    out: list[ClientTool] = []
    for name, tool in tools.items():
        where = f"{field}.{name}"
        if not name or len(name) > 128 or not name.isprintable():
            raise BadRequestError(f"{field}: {name[:64]!r} is not a tool name (1-128 printable characters)")
        if not isinstance(tool, dict):
            raise BadRequestError(f"{where}: must be an object {{description, inputSchema}}")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise BadRequestError(f"{where}.description: must be a string")
        key = "inputSchema" if tool.get("inputSchema") is not None else "parameters"
        schema = tool.get(key)
        if schema is None:
            schema = {"type": "object"}
        if not isinstance(schema, dict):
            raise BadRequestError(f"{where}.{key}: must be a JSON schema object")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise BadRequestError(f"{where}.{key}: not a valid JSON schema: {exc.message}") from None
        approval = tool.get("requireApproval", False)
        if not isinstance(approval, bool):
            raise BadRequestError(f"{where}.requireApproval: must be a boolean")
        out.append(ClientTool(name, description, schema, requires_approval=approval))
    return out


CLIENT_TOOL_KEYS = frozenset({"id", "description", "inputSchema", "parameters", "requireApproval"})
"""The keys of a ``clientTools`` entry procmesh takes (`client_tools`); the others are
`client_tool_extras`."""


def client_tool_extras(tools: dict[str, Any], field: str = "clientTools") -> list[str]:
    """The keys of the ``clientTools`` entries procmesh does not apply, as ``clientTools.NAME.KEY``
    (the call's warnings: `step_settings.IGNORED_CLIENT_TOOL_KEYS`)."""
    return [
        f"{field}.{name}.{key}"
        for name, tool in tools.items()
        if isinstance(tool, dict)
        for key in sorted(set(tool) - CLIENT_TOOL_KEYS)
    ]


_M = TypeVar("_M", bound=BaseModel)


def check_stream_format(value: Any) -> None:
    """The reference's ``format`` (generate, stream, approve / decline): ``"mastra"``, what procmesh
    streams, is taken; any other (``"aisdk"``) is a 400 naming it, never a run in another format."""
    if value not in (None, "mastra"):
        raise BadRequestError(f"format: procmesh streams the 'mastra' format only, got {label(value)}")


def validated(model: type[_M], data: Any) -> _M:
    """`data` as `model`; a 400 naming every problem by its field (the reference's names)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
        )
        raise BadRequestError(problems) from None


def step_kwargs(body: StepOptions) -> dict[str, Any]:
    """The `CallOptions` fields of the options both APIs share."""
    instructions = system_texts(body.instructions, "instructions")
    return {
        "instructions": None if instructions is None else "\n\n".join(instructions),
        "system": system_texts(body.system, "system") or (),
        "model_settings": body.model_settings.wire() if body.model_settings else None,
        "tool_choice": tool_choice(body.tool_choice),
        "active_tools": body.active_tools,
        "structured_output": _structured_output(body.structured_output),
        "prepare_steps": step_rules(body.prepare_steps),
    }


LANES = ("input", "output", "error")
_MAX_PROCESSOR_ID = 256


def lane_ids(body: StepOptions) -> dict[str, list[str]]:
    """The per-call processor lists as ids, by lane; a lane not given is absent (the agent's)."""
    out: dict[str, list[str]] = {}
    for kind in LANES:
        entries = getattr(body, f"{kind}_processors")
        if entries is not None:
            out[kind] = [_processor_id(e, f"{kind}Processors.{i}") for i, e in enumerate(entries)]
    return out


def _processor_id(entry: Any, where: str) -> str:
    """A lane entry as the id it names: a string, or what @mastra/client-js sends for a processor
    object (JSON drops its functions: ``{id, name?, ...}``, of which the id counts)."""
    value = entry.get("id") if isinstance(entry, dict) else entry
    if isinstance(entry, dict) and value is None:
        raise NotSupportedError(
            f"{where}: processors defined in the caller's code are not supported by procmesh: "
            "their code cannot travel; name a processor the orchestrator's sidecars host by its id"
        )
    if not isinstance(value, str) or not value or len(value) > _MAX_PROCESSOR_ID or not value.isprintable():
        raise BadRequestError(f"{where}: must be a processor id (a string) or an object with an 'id'")
    return value


def _structured_output(body: _StructuredOutputBody | None) -> StructuredOutput | None:
    if body is None:
        return None
    if body.model is not None and not (isinstance(body.model, str) and body.model):
        raise BadRequestError(
            "structuredOutput.model: give the structuring model as a reference, a `models` key or "
            "'provider/model-id' (or leave it out: the agent's model answers in JSON)"
        )
    try:
        jsonschema.validators.validator_for(body.schema_).check_schema(body.schema_)
    except jsonschema.SchemaError as exc:
        raise BadRequestError(f"structuredOutput.schema: not a valid JSON schema: {exc.message}") from None
    return StructuredOutput(
        body.schema_,
        body.error_strategy,
        body.fallback_value,
        body.instructions,
        body.model,
        body.json_prompt_injection,
    )
