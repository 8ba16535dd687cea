"""Regular expressions over user and model text, on RE2: linear time whatever the input.

Python's `re` backtracks: the old PII e-mail pattern took 9 s of CPU on 60,000 characters without
an ``@`` (quadratic), structured-output's fence pattern was cubic on a fence followed by spaces,
and a hook that burns CPU freezes its sidecar. RE2 (Google's engine, PyPI ``google-re2``) never
backtracks: a search costs time linear in the text for every pattern it accepts. In exchange it
refuses backreferences and lookaround, which only backtracking can run.

RE2's ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII-only. `SPACE`, `WORD` and `DIGIT` are the
bracket-expression bodies of Python's Unicode ``\\s``, ``\\w`` and ``\\d``, so a pattern moved from
`re` keeps matching what it matched (tests/unit/sidecars/test_linear_regex.py compares them over
every code point). Unicode ``\\b`` has no RE2 equivalent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, cast

# google-re2 ships no type information; the Protocols below type the part of its API used here.
import re2  # type: ignore[import-untyped]

SPACE = r"\t-\r\x1c-\x1f\x85\p{Z}"
"""Python's ``\\s`` (``str.isspace``), to use inside ``[...]``."""
WORD = r"\p{L}\p{N}_"
"""Python's ``\\w`` (``str.isalnum`` or ``_``), to use inside ``[...]``."""
DIGIT = r"\p{Nd}"
"""Python's ``\\d`` (any Unicode decimal digit)."""


class Match(Protocol):
    """A match; offsets are in characters, as with `re`."""

    def start(self) -> int:
        """Where the match begins."""
        ...

    def end(self) -> int:
        """Where the match ends."""
        ...

    def group(self, index: int = 0, /) -> str:
        """The matched text (``index`` 0) or a group's."""
        ...


class Pattern(Protocol):
    """A compiled RE2 pattern (the subset of `re.Pattern` the built-ins use)."""

    def finditer(self, text: str) -> Iterator[Match]:
        """Non-overlapping matches, left to right."""
        ...

    def match(self, text: str) -> Match | None:
        """A match anchored at the start of `text`."""
        ...

    def search(self, text: str) -> Match | None:
        """The first match anywhere in `text`."""
        ...

    def sub(self, repl: str | Callable[[Match], str], text: str) -> str:
        """`text` with every match replaced."""
        ...


class PatternError(ValueError):
    """A pattern RE2 does not accept (a syntax error, a backreference, lookaround, ...)."""


def compile_pattern(
    pattern: str, *, ignore_case: bool = False, multiline: bool = False, dot_all: bool = False
) -> Pattern:
    """Compile `pattern` with RE2; the keywords are `re`'s IGNORECASE, MULTILINE and DOTALL."""
    options = re2.Options()
    options.log_errors = False  # RE2 would also print the error to stderr; the caller reports it
    options.case_sensitive = not ignore_case
    options.dot_nl = dot_all
    # RE2 has no multiline option outside POSIX mode, only the inline flag.
    source = f"(?m){pattern}" if multiline else pattern
    try:
        return cast(Pattern, re2.compile(source, options))
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        raise PatternError(detail.decode() if isinstance(detail, bytes) else str(detail)) from None


def escape(text: str) -> str:
    """`text` as a pattern matching itself literally."""
    return cast(str, re2.escape(text))
