"""sdk/node/README.md's layout table names every module of the Node SDK's ``lib/`` (the table is
how a reader finds where a behaviour lives; files added without a row had left it a third short).
"""

from __future__ import annotations

import re

from tests.conftest import REPO

NODE = REPO / "sdk" / "node"


def unlisted(table: str) -> list[str]:
    """The lib/ modules (a folder counts as one, written ``lib/name/``) the table names nowhere."""
    named = set(re.findall(r"`(lib/[\w./]+)`", table))
    modules = [f"{p.relative_to(NODE)}{'/' if p.is_dir() else ''}" for p in (NODE / "lib").iterdir()]
    return sorted(m for m in modules if m not in named and m.endswith((".js", "/")))


def test_the_layout_table_names_every_lib_module() -> None:
    text = (NODE / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Layout") :]
    assert "`lib/hooks.js`" in table  # the table was found
    assert unlisted(table) == []


def test_the_check_catches_a_module_without_a_row() -> None:
    assert "lib/server.js" in unlisted("| `lib/hooks.js` | the hook table |")
