"""A guard's cheap pre-check: clear cases settled by patterns, without asking the judge.

The ``precheck`` option every judged guard has: ``deny`` patterns flag a text one of them finds a
match in (the guard's strategy applies: block, warn or filter), ``allow`` patterns let a text one
of them matches in full pass; any other text goes to the judge. Deny is checked first. Patterns
run on RE2 (`_linear_re`, as `regex-filter`'s): time linear in the text. A text settled here costs
no judge call; the violation's detail says ``precheck: deny`` and the pattern's index.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from procmesh_sidecars.builtins._linear_re import Pattern, PatternError, compile_pattern

FLAGGED: dict[str, Literal["block", "warn", "drop"]] = {"block": "block", "warn": "warn", "filter": "drop"}
"""The strategies a deny pattern can settle, and the verdict's action for each (a redaction, a
rewrite or a translation needs the judge's answer)."""


class Precheck(BaseModel):
    """The ``precheck`` option: ``{deny: [pattern, ...], allow: [pattern, ...]}``."""

    model_config = ConfigDict(extra="forbid")

    deny: list[str] = []
    """A text any of these finds a match in is flagged without the judge."""
    allow: list[str] = []
    """A text any of these matches in full passes without the judge."""
    _deny: list[Pattern] = PrivateAttr(default_factory=list)
    _allow: list[Pattern] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _compile(self) -> Precheck:
        try:
            self._deny = [compile_pattern(p) for p in self.deny]
            self._allow = [compile_pattern(f"^(?:{p})$") for p in self.allow]
        except PatternError as exc:
            raise ValueError(f"precheck: a pattern RE2 does not accept: {exc}") from None
        return self

    def settle(self, text: str) -> tuple[str, int] | None:
        """``("deny", i)`` or ``("allow", i)`` for the first pattern that settles `text`; None: judge it."""
        for i, pattern in enumerate(self._deny):
            if pattern.search(text) is not None:
                return "deny", i
        for i, pattern in enumerate(self._allow):
            if pattern.search(text) is not None:
                return "allow", i
        return None


def check_strategy(precheck: Precheck | None, strategy: Any) -> None:
    """A deny pattern settles only a strategy that needs nothing from the judge (`FLAGGED`)."""
    if precheck is not None and precheck.deny and strategy not in FLAGGED:
        raise ValueError(
            f"precheck.deny settles strategies {', '.join(FLAGGED)} only; strategy {strategy!r} "
            "needs the judge's answer (use allow only, or another strategy)"
        )
