"""prepareStep (SEED-GAPS B28): a call's own processInputStep, without a processor.

The reference's ``prepareStep`` is a function of generate()/stream() that it wraps in a
processor (``prepare-step``) placed after the agent's input processors, called before each
model step with the step's state; what it returns overrides that step only. A function cannot
cross a process boundary, so procmesh has it in two forms:

- in process, `CallOptions.prepare_step`: a Python callable (sync or async) given a
  `StepContext`, returning None, a `StepOverride` or a mapping of its fields;
- over HTTP and gRPC, `CallOptions.prepare_steps`: `StepRule`s (the body's ``prepareSteps``),
  each an override for one step number (``stepNumber``) or for every step from one on
  (``fromStepNumber``); every rule that applies to a step is merged in order, a later one's
  keys winning.

Both run as framework processors at the end of the input lane, the rules before the callable,
so the overrides apply after every processInputStep of the lane (as the reference's do).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.framework import FrameworkProcessor
from procmesh_orchestrator.run.hooks import HookArgs, InputStepArgs, InputStepResult

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

R = TypeVar("R")

PROCESSOR_ID = "prepare-step"
"""The reference's id for the processor it wraps prepareStep in."""
TOOL_CHOICES = ("auto", "none", "required")
WIRE_NAMES = {
    "model": "model",
    "tool_choice": "toolChoice",
    "active_tools": "activeTools",
    "system": "system",
    "provider_options": "providerOptions",
    "model_settings": "modelSettings",
}
"""`StepOverride`'s fields by the names the HTTP body and the reference give them."""


@dataclass(frozen=True)
class StepContext:
    """What a `CallOptions.prepare_step` callable is given: the step about to call the model, as
    the input lane left it (the reference's ``{stepNumber, steps, messages, model, ...}``)."""

    step_number: int
    steps: list[dict[str, Any]]
    """The steps done so far (the result's ``steps``)."""
    messages: list[dict[str, Any]]
    system_messages: list[dict[str, Any]]
    model: str
    """The id of the model the step would call."""
    tools: list[dict[str, Any]]
    """The tools offered (``name``, ``description``, ``inputSchema``)."""
    tool_choice: Any
    active_tools: list[str] | None
    provider_options: dict[str, Any]
    model_settings: dict[str, Any]
    request_context: Mapping[str, Any]


@dataclass(frozen=True)
class StepOverride:
    """What one step changes; None: as it is. It lasts that step only."""

    model: str | None = None
    """A ``models`` key or ``provider/model-id`` (an unknown one fails the run naming it)."""
    tool_choice: Any = None
    """``auto``, ``none``, ``required`` or ``{"type": "tool", "toolName": NAME}``."""
    active_tools: Sequence[str] | None = None
    """The names of the offered tools the model may call at this step."""
    system: str | Sequence[str] | None = None
    """Replaces the step's system messages (instructions included), as a processInputStep's
    ``systemMessages`` does."""
    provider_options: Mapping[str, Any] | None = None
    model_settings: Mapping[str, Any] | None = None
    """Replaces the step's model settings (``temperature``, ``maxOutputTokens``, ...)."""

    def merged(self, later: StepOverride) -> StepOverride:
        """This override with every field `later` sets taken from it."""
        given = {f.name: getattr(later, f.name) for f in fields(later) if getattr(later, f.name) is not None}
        return StepOverride(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **given})


@dataclass(frozen=True)
class StepRule:
    """A declarative prepareStep entry: `override` at step `step_number`, or at every step from
    `from_step_number` on (exactly one of them is set)."""

    override: StepOverride
    step_number: int | None = None
    from_step_number: int | None = None

    def __post_init__(self) -> None:
        if (self.step_number is None) == (self.from_step_number is None):
            raise ValueError("a step rule needs exactly one of step_number and from_step_number")

    def applies(self, step_number: int) -> bool:
        if self.step_number is not None:
            return step_number == self.step_number
        return self.from_step_number is not None and step_number >= self.from_step_number

    def dump(self) -> dict[str, Any]:
        """The rule as the HTTP body writes it (a snapshot keeps it so)."""
        when = {"stepNumber": self.step_number} if self.step_number is not None else {}
        if self.from_step_number is not None:
            when = {"fromStepNumber": self.from_step_number}
        override = {
            WIRE_NAMES[f.name]: _plain(getattr(self.override, f.name))
            for f in fields(self.override)
            if getattr(self.override, f.name) is not None
        }
        return {"when": when, "override": override}


StepAnswer = StepOverride | Mapping[str, Any] | None
PrepareStepFunction = Callable[[StepContext], StepAnswer | Awaitable[StepAnswer]]
"""`CallOptions.prepare_step`: called before each model step; its override lasts that step."""


def load_rules(data: Sequence[Mapping[str, Any]]) -> tuple[StepRule, ...]:
    """Rules as `StepRule.dump` wrote them (a snapshot's, already validated when it was taken)."""
    rules = []
    for rule in data:
        when, override = rule["when"], rule["override"]
        names = {wire: name for name, wire in WIRE_NAMES.items()}
        rules.append(
            StepRule(
                StepOverride(**{names[k]: v for k, v in override.items()}),
                when.get("stepNumber"),
                when.get("fromStepNumber"),
            )
        )
    return tuple(rules)


def override_of(value: Any, where: str) -> StepOverride | None:
    """What a prepare_step callable returned as a `StepOverride`; ConfigError naming what is wrong
    (unknown keys by name, a value of the wrong shape)."""
    if value is None or isinstance(value, StepOverride):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} returned {type(value).__name__}: give None, a StepOverride or a mapping")
    unknown = sorted(str(k) for k in value if k not in WIRE_NAMES)
    if unknown:
        raise ConfigError(f"{where} returned unknown keys {unknown} (it may return: {sorted(WIRE_NAMES)})")
    override = StepOverride(**value)
    problem = shape_problem(override)
    if problem is not None:
        raise ConfigError(f"{where} returned {problem}")
    return override


def shape_problem(override: StepOverride) -> str | None:
    """Why an override's values cannot apply (None: they can)."""
    choice = override.tool_choice
    if choice is not None and choice not in TOOL_CHOICES:
        named = isinstance(choice, Mapping) and set(choice) == {"type", "toolName"}
        if not (named and choice["type"] == "tool" and isinstance(choice["toolName"], str)):
            tool = "{'type': 'tool', 'toolName': NAME}"
            return f"tool_choice {choice!r}: one of {list(TOOL_CHOICES)} or {tool}"
    for name in ("active_tools", "system"):
        value = getattr(override, name)
        texts = [value] if name == "system" and isinstance(value, str) else value
        if value is not None and (isinstance(texts, str) or not all(isinstance(t, str) for t in texts)):
            return f"{name} {value!r}: a list of strings" + (" or a string" if name == "system" else "")
    for name in ("provider_options", "model_settings"):
        if getattr(override, name) is not None and not isinstance(getattr(override, name), Mapping):
            return f"{name} {getattr(override, name)!r}: a mapping"
    if override.model is not None and not (isinstance(override.model, str) and override.model):
        return f"model {override.model!r}: a models key or provider/model-id"
    return None


class StepModelError(ConfigError):
    """A call's `StepRule` names a model the agent cannot call (the APIs answer 400)."""


def check_models(rules: Sequence[StepRule], models: Mapping[str, Any]) -> None:
    """StepModelError naming the models `rules` give that `models` (the agent's) cannot."""
    named = {r.override.model for r in rules if r.override.model is not None}
    unknown = sorted(m for m in named if models.get(m) is None)
    if unknown:
        raise StepModelError(
            f"prepareSteps: unknown model {', '.join(map(repr, unknown))} "
            f"(configured: {sorted(models)}, or provider/model-id)"
        )


class PrepareStep(FrameworkProcessor):
    """The input lane's last processInputStep: a call's `StepRule`s, or its callable."""

    processor_id = PROCESSOR_ID
    hooks = frozenset({"process_input_step"})

    def __init__(self, source: Sequence[StepRule] | PrepareStepFunction) -> None:
        self.source = source
        self.key = f"framework:{PROCESSOR_ID}:{'rules' if isinstance(source, Sequence) else 'function'}"

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if not isinstance(args, InputStepArgs):
            return None
        step = run.info.step_number
        if isinstance(self.source, Sequence):
            override: StepOverride | None = None
            for rule in self.source:
                if rule.applies(step):
                    override = rule.override if override is None else override.merged(rule.override)
        else:
            returned = self.source(_context(run, args, step))
            if inspect.isawaitable(returned):
                returned = await returned
            override = override_of(returned, "prepare_step")
        return None if override is None else _result(run, override)  # type: ignore[return-value]


def _context(run: RunCore, args: InputStepArgs, step: int) -> StepContext:
    return StepContext(
        step_number=step,
        steps=list(args.steps),
        messages=args.messages,
        system_messages=args.system_messages,
        model=args.model,
        tools=list(args.tools),
        tool_choice=args.tool_choice,
        active_tools=args.active_tools,
        provider_options=dict(args.provider_options),
        model_settings=dict(args.model_settings),
        request_context=dict(run.options.request_context),
    )


def _result(run: RunCore, override: StepOverride) -> InputStepResult:
    if override.model is not None and run.agent.models.get(override.model) is None:
        raise ConfigError(
            f"prepareStep: unknown model {override.model!r} at step {run.info.step_number} "
            f"(configured: {sorted(run.agent.models)}, or provider/model-id)"
        )
    system = [override.system] if isinstance(override.system, str) else override.system
    return InputStepResult(
        model=override.model,
        tool_choice=_plain(override.tool_choice),
        active_tools=None if override.active_tools is None else list(override.active_tools),
        system_messages=None if system is None else [msgs.text_message("system", t) for t in system],
        provider_options=_plain(override.provider_options),
        model_settings=_plain(override.model_settings),
    )


def _plain(value: Any) -> Any:
    """A mapping or sequence as the dict or list the run and the snapshot keep."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return value
