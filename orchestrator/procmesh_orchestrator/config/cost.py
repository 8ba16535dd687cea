"""An agent's spending limit in the configuration (``costControl``, ``prices``): what a model
costs, the limit and its scope, each of which may come from the request context per tenant."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.store import MAX_COST_WINDOW_SECONDS


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class PriceConfig(_Model):
    """What a model costs, per million tokens (any currency: `costControl.maxCost` is in the same)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


_WINDOW = re.compile(r"^(?P<n>[1-9]\d*)(?P<unit>[smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


CostScope = Literal["run", "resource", "thread", "user", "organization", "session", "agent", "global"]
"""Whose spending counts: the reference's six (``user``, ``organization`` and ``session`` are the
request context's ``userId``, ``organizationId`` and ``sessionId``, as the reference reads them)
and procmesh's two wider ones."""

PROCESSOR_NAMES = ("token-cost-control", "cost-guard")
"""The lane entry's names: the reference's id, and ``cost-guard`` for its deprecated alias
``CostGuardProcessor`` (the same processor: its tripwires and violations say
``token-cost-control``)."""


SETTING_TAGS = {"<value>", "<fromContext>"}
"""Discriminator tags of a setting that may come from the request context (error messages leave
them out)."""


def _from_context(value: Any) -> str:
    """A setting given as ``{fromContext, default}`` or as its value (errors name one form only)."""
    return "<value>" if isinstance(value, str | int | float) else "<fromContext>"


class MaxCostFromContext(_Model):
    """``maxCost`` per tenant: each run takes the request context's `from_context` key (a number
    above 0, else the run fails before any hook naming the key), or `default` without it; with
    `cases`, the limit of the key's value instead (``fromContext: resourceId``: per API key)."""

    from_context: str = Field(min_length=1)
    default: float = Field(gt=0)
    """The limit of a run whose context lacks the key (and of a gateway call outside any run)."""
    cases: dict[str, Annotated[float, Field(gt=0)]] | None = None
    """Limits by the key's value; any other value (or none) gets `default`."""


class ScopeFromContext(_Model):
    """``scope`` per tenant: each run takes the request context's `from_context` key (one of the
    scopes, else the run fails before any hook naming the key), or `default` without it."""

    from_context: str = Field(min_length=1)
    default: CostScope
    cases: dict[str, CostScope] | None = None
    """Scopes by the key's value; any other value (or none) gets `default`."""


class CostControlConfig(_Model):
    """An agent's spending limit (the reference's ``TokenCostControl``), checked before each model
    call and updated after it, in the store every replica shares (`run.framework.cost`)."""

    max_cost: Annotated[
        Annotated[float, Field(gt=0), Tag("<value>")] | Annotated[MaxCostFromContext, Tag("<fromContext>")],
        Discriminator(_from_context),
    ]
    """The limit, in the currency of `prices`: a call is refused once the scope spent this much.
    ``{fromContext: KEY, default: VALUE}``: each run's from its request context."""
    scope: Annotated[
        Annotated[CostScope, Tag("<value>")] | Annotated[ScopeFromContext, Tag("<fromContext>")],
        Discriminator(_from_context),
    ] = "resource"
    """Whose spending counts: the run alone, the call's resource, its thread, the request context's
    ``userId``, ``organizationId`` or ``sessionId``, the agent, or all agents together. A call
    without that id is not limited by that scope (the reference fails open too).
    ``{fromContext: KEY, default: VALUE}``: each run's from its request context."""
    window: str = "7d"
    """How far back spending counts: ``<n>s``, ``<n>m``, ``<n>h`` or ``<n>d`` (at most 366 days)."""
    strategy: Literal["block", "warn"] = "block"
    """``block``: a tripwire ends the run; ``warn``: a violation is recorded and the call goes on."""
    message: str = "Cost control: estimated cost limit exceeded ({usage}/{limit})"
    """The tripwire's reason; ``{usage}`` and ``{limit}`` are filled in."""
    warn_at_percent: float | None = Field(default=None, gt=0, lt=100)
    """Also record a (soft) violation, once per call, when spending reaches this share of the limit."""
    reserve_output_tokens: int = Field(default=1024, ge=0)
    """Output tokens a call holds against the limit while it runs (its ``maxOutputTokens`` setting
    wins); the actual usage replaces the estimate when the call ends."""

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        match = _WINDOW.match(value)
        if match is None:
            raise ValueError(f"window must be <n>s, <n>m, <n>h or <n>d (e.g. 30d), got {value!r}")
        if int(match["n"]) * _UNIT_SECONDS[match["unit"]] > MAX_COST_WINDOW_SECONDS:
            raise ValueError(f"window {value!r} is longer than 366 days")
        return value

    @property
    def window_seconds(self) -> int:
        """The window as seconds."""
        match = _WINDOW.match(self.window)
        assert match is not None  # validated
        return int(match["n"]) * _UNIT_SECONDS[match["unit"]]


def lane_cost_control(entries: list[Any], where: str) -> tuple[int, CostControlConfig] | None:
    """The `token-cost-control` entry of an input lane (its index and options as a limit), or None.

    The entry takes ``processor``, ``options`` (this model's keys) and ``onViolation``; one per
    agent, since each model call is counted once per agent (`run.framework.cost`)."""
    found = [(i, e) for i, e in enumerate(entries) if getattr(e, "processor", None) in PROCESSOR_NAMES]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(
            f"{where}: token-cost-control is listed {len(found)} times (at {[i for i, _ in found]}); "
            "an agent has one (its scope may come from the request context)"
        )
    i, entry = found[0]
    given = entry.model_fields_set - {"processor", "options", "on_failure", "on_violation"}
    if given or entry.on_failure is not None:
        keys = sorted(to_camel(k) for k in given | ({"on_failure"} if entry.on_failure else set()))
        raise ValueError(
            f"{where}.{i}: token-cost-control runs in the orchestrator and takes only options and "
            f"onViolation, not {', '.join(keys)}"
        )
    try:
        return i, CostControlConfig.model_validate(entry.options)
    except ValidationError as exc:  # named where the entry is, not where the agent is
        problems = [
            f"{where}.{i}.options.{'.'.join(str(p) for p in e['loc'] if p not in SETTING_TAGS)}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ValueError("; ".join(problems)) from None


class TokenCostControl(dict[str, Any]):
    """The seeds' ``new TokenCostControl({maxCost, scope, window, ...})`` in the Python API: the
    ``token-cost-control`` lane entry for a config built in Python (`parse_config`), checked as it
    is made (a bad option raises here, as the reference's constructor does). Options are this
    module's `CostControlConfig` in snake_case; `on_violation` is the entry's route (``log`` or
    ``{"webhook": URL}``): a Python callable goes in `CallOptions.on_violation` by processor id."""

    def __init__(self, *, on_violation: Any = None, **options: Any) -> None:
        CostControlConfig.model_validate(options)
        entry: dict[str, Any] = {"processor": PROCESSOR_NAMES[0], "options": options}
        super().__init__(entry if on_violation is None else {**entry, "onViolation": on_violation})


CostGuardProcessor = TokenCostControl
"""The reference's deprecated alias (the same entry, id ``token-cost-control``)."""
