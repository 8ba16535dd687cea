"""The documentation pages the `test_docs_*` modules check, and what those checks share: a page
parsed into code spans, fenced blocks and links (`Doc`), its command lines, its repository-relative
name, and the orchestrator's package folders a listing must name.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "proto" / "README.md",
        REPO / "sdk" / "README.md",
        REPO / "sdk" / "node" / "README.md",
        REPO / "sidecars" / "README.md",
        REPO / "orchestrator" / "README.md",
        REPO / "bench" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)

PACKAGES = {"procmesh": "sdk", "procmesh_orchestrator": "orchestrator", "procmesh_sidecars": "sidecars"}
"""An import package's path (`procmesh_orchestrator/run/loop.py`) is read inside its distribution."""


@dataclass(frozen=True, repr=False)
class Doc:
    """A markdown file split into what the checks read: inline code spans and fenced blocks."""

    path: Path
    spans: list[str]
    blocks: list[tuple[str, str]]  # (language, body)
    links: list[str]
    text: str

    @classmethod
    def parse(cls, path: Path, text: str | None = None) -> Doc:
        text = path.read_text(encoding="utf-8") if text is None else text
        blocks = [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        # a span may wrap onto the next line but not across a paragraph (CommonMark)
        paragraphs = re.split(r"\n\s*\n", prose)
        found = [re.finditer(r"``\s?(.+?)\s?``|`([^`]+)`", par, flags=re.S) for par in paragraphs]
        spans = [" ".join((m[1] or m[2]).split()) for m in itertools.chain(*found)]
        links = re.findall(r"\]\(([^)\s]+)\)", prose)
        return cls(path, spans, blocks, links, text)

    def commands(self) -> list[str]:
        """Command lines: shell blocks' lines and inline spans of more than one word."""
        lines = [line for lang, body in self.blocks if lang in ("sh", "") for line in body.splitlines()]
        return [*lines, *(s for s in self.spans if " " in s.strip())]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.as_posix()


def _command_lines(doc: Doc) -> list[str]:
    """Command lines with their continuation lines joined (a line ending in a backslash)."""
    bodies = [body.replace("\\\n", " ") for lang, body in doc.blocks if lang in ("sh", "")]
    lines = [" ".join(line.split()) for body in bodies for line in body.splitlines()]
    return [*lines, *(s for s in doc.spans if " " in s.strip())]


ORCHESTRATOR = "orchestrator/procmesh_orchestrator/"


def missing_packages(entries: set[str]) -> list[str]:
    """Every package folder of the orchestrator (a folder with an __init__.py) the listing lacks."""
    packages = sorted(p.parent for p in (REPO / ORCHESTRATOR).glob("*/__init__.py"))
    return [f"{_rel(p)}/" for p in packages if f"{_rel(p)}/" not in entries]


def made_up(text: str) -> Doc:
    """A made-up page, docs/made-up.md, for a check to show it fails."""
    return Doc.parse(REPO / "docs" / "made-up.md", text)
