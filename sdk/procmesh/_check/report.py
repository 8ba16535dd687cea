"""The checker's report: one printed line per check (PASS/FAIL/SKIP), then a summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Report:
    """The checks so far; each is printed as it is added."""

    out: TextIO
    lines: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, status: str, name: str, detail: str = "") -> None:
        self.lines.append((status, name, detail))
        self.out.write(f"{status:<4}  {name}" + (f": {detail}" if detail else "") + "\n")
        self.out.flush()

    def check(self, name: str, problems: Sequence[str], ok: str = "") -> bool:
        """PASS with `ok`, or FAIL listing `problems`."""
        if problems:
            self.add("FAIL", name, "; ".join(problems))
            return False
        self.add("PASS", name, ok)
        return True

    def count(self, status: str) -> int:
        return sum(1 for s, _, _ in self.lines if s == status)

    def summary(self) -> str:
        return f"{self.count('PASS')} passed, {self.count('FAIL')} failed, {self.count('SKIP')} skipped"


class Unreachable(Exception):
    """The sidecar stopped answering: the remaining checks cannot run."""
