"""stopWhen: conditions over the accumulated steps that end the loop after a step's tool work.

The reference's `stepCountIs(n)` and `hasToolCall(name)`, and (Python API) any callable over
the steps; any condition that holds stops the run (maxSteps still caps it). As data they are
``{"stepCountIs": 3}`` and ``{"hasToolCall": "finish"}`` (config, HTTP, a suspended run's
snapshot); a callable cannot be stored, so a resumed run keeps only the data conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Steps = list[dict[str, Any]]


@dataclass(frozen=True)
class StepCountIs:
    """Stop once this many steps have run."""

    count: int

    def __call__(self, steps: Steps) -> bool:
        return len(steps) >= self.count


@dataclass(frozen=True)
class HasToolCall:
    """Stop after a step in which the model called this tool."""

    tool_name: str

    def __call__(self, steps: Steps) -> bool:
        return bool(steps) and any(c.get("toolName") == self.tool_name for c in steps[-1]["toolCalls"])


StopCondition = StepCountIs | HasToolCall | Callable[[Steps], bool]


def should_stop(conditions: Sequence[StopCondition], steps: Steps) -> bool:
    """Whether any condition holds for the steps so far."""
    return any(condition(steps) for condition in conditions)


def parse(items: Any, where: str = "stopWhen") -> tuple[StopCondition, ...]:
    """Conditions from their data form: one object or a list, each ``{stepCountIs: n}`` or
    ``{hasToolCall: name}``; a clear ValueError otherwise."""
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list of conditions, got {type(items).__name__}")
    out: list[StopCondition] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or len(item) != 1:
            raise ValueError(f"{where}[{i}] must be {{stepCountIs: n}} or {{hasToolCall: name}}: {item!r}")
        ((key, value),) = item.items()
        if key in ("stepCountIs", "step_count_is") and isinstance(value, int) and value >= 1:
            out.append(StepCountIs(value))
        elif key in ("hasToolCall", "has_tool_call") and isinstance(value, str) and value:
            out.append(HasToolCall(value))
        else:
            raise ValueError(
                f"{where}[{i}]: {key!r}={value!r} is not a condition (stepCountIs: a count >= 1, "
                "hasToolCall: a tool name)"
            )
    return tuple(out)


def dump(conditions: Sequence[StopCondition]) -> list[dict[str, Any]]:
    """The data conditions (callables are left out: they cannot be stored)."""
    out: list[dict[str, Any]] = []
    for c in conditions:
        if isinstance(c, StepCountIs):
            out.append({"stepCountIs": c.count})
        elif isinstance(c, HasToolCall):
            out.append({"hasToolCall": c.tool_name})
    return out
