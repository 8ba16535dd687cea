"""The log lines the docs show are lines the code writes: each JSON log record in a code block
(`{"level": ..., "logger": ..., "message": ...}`, what `--log-format json` prints) names a logger of
ours, and its message is one that logger's module formats (a `%s` / `%d` / `%r` / `%.3f` of a
logging call's format string stands for any value).

`test_the_check_catches_made_up_log_lines` feeds the check a made-up document.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

from tests.conftest import REPO
from tests.unit.doc_pages import PACKAGES, Doc, _rel, made_up

_PLACEHOLDER = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfi]")


def module_file(logger: str) -> Path | None:
    """The source file of the module a logger is named after (`procmesh._server`), or None."""
    top, *rest = logger.split(".")
    if top not in PACKAGES:
        return None
    base = REPO / PACKAGES[top] / top / Path(*rest) if rest else REPO / PACKAGES[top] / top
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def message_patterns(path: Path) -> list[re.Pattern[str]]:
    """Every string literal of a module (implicit concatenations joined) as a pattern its
    placeholders match any value in."""
    patterns = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _PLACEHOLDER.search(node.value):
            parts = _PLACEHOLDER.split(node.value)
            patterns.append(re.compile(".+?".join(re.escape(p) for p in parts), flags=re.S))
    return patterns


def log_line_problems(doc: Doc) -> list[str]:
    problems = []
    for _lang, body in doc.blocks:
        for line in body.splitlines():
            if not line.lstrip().startswith("{") or '"logger"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                problems.append(f"{_rel(doc.path)}: a JSON log line does not parse: {line}")
                continue
            logger, message = record.get("logger"), record.get("message")
            path = module_file(str(logger))
            if path is None:
                problems.append(f"{_rel(doc.path)}: logger {logger!r} is no module of ours")
            elif not any(p.fullmatch(str(message)) for p in message_patterns(path)):
                problems.append(f"{_rel(doc.path)}: {logger} logs no message like {message!r}")
    return problems


def test_json_log_lines_in_the_docs_are_the_codes(docs: list[Doc]) -> None:
    problems = [p for doc in docs for p in log_line_problems(doc)]
    assert sum('"logger"' in body for doc in docs for _lang, body in doc.blocks) >= 1  # it reads some
    assert problems == []


def test_the_check_catches_made_up_log_lines() -> None:
    fake = made_up(
        "```json\n"
        '{"level": "INFO", "logger": "procmesh._server", "message": "serving processors [\'a\'] on :1"}\n'
        '{"logger": "procmesh._server", "message": "serving processors [\'a\'] and tools [] on :1"}\n'
        '{"level": "INFO", "logger": "procmesh._nowhere", "message": "hello"}\n'
        "```\n"
    )
    assert log_line_problems(fake) == [
        "docs/made-up.md: procmesh._server logs no message like \"serving processors ['a'] on :1\"",
        "docs/made-up.md: logger 'procmesh._nowhere' is no module of ours",
    ]
