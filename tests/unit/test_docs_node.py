"""sdk/node/README.md's layout table names every module of the Node SDK's ``lib/`` (the table is
how a reader finds where a behaviour lives; files added without a row had left it a third short),
and docs/other-languages.md's hook tables name every argument of the Node SDK's hook table
(``lib/hooks.js``, read as text: the unit tier runs no Node).
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


def node_hook_table(source: str) -> tuple[set[str], dict[str, set[str]]]:
    """lib/hooks.js's BASE_ARGUMENTS, and each hook's own arguments (`...MESSAGES` spread)."""
    quoted = lambda text: re.findall(r"'(\w+)'", text)  # noqa: E731
    base = set(quoted(source.split("const BASE_ARGUMENTS = Object.freeze([", 1)[1].split("]", 1)[0]))
    messages = quoted(source.split("const MESSAGES = [", 1)[1].split("]", 1)[0])
    hooks = {}
    for name, extra in re.findall(
        r"hook\(\s*'(\w+)', '\w+', \d+, '\w+', (MESSAGES|\[.*?\])", source, flags=re.S
    ):
        hooks[name] = set(quoted(extra)) | (set(messages) if "MESSAGES" in extra else set())
    return base, hooks


def node_argument_problems(page: str, source: str) -> list[str]:
    """The "Every hook gets" table names each base argument, each hook's row its own arguments."""
    base, hooks = node_hook_table(source)
    every = page.split("Every hook gets:", 1)[1].split("And per hook:", 1)[0]
    problems = [
        f"docs/other-languages.md: no hook argument {a}" for a in sorted(base) if f"`{a}" not in every
    ]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", page, flags=re.M))
    for hook, arguments in hooks.items():
        said = set(re.findall(r"`(\w+)`", rows.get(hook, "")))
        problems += [f"docs/other-languages.md: {hook} takes {a}, unnamed" for a in sorted(arguments - said)]
    return problems


def test_the_node_hook_tables_name_every_argument() -> None:
    source = (NODE / "lib" / "hooks.js").read_text(encoding="utf-8")
    base, hooks = node_hook_table(source)
    assert {"abort", "requestContext", "model"} <= base  # the table was read
    assert len(hooks) == 10
    assert hooks["processInput"] == {"messages", "messageList", "systemMessages"}
    assert "modelSpecVersion" in hooks["processLLMRequest"]
    page = (REPO / "docs" / "other-languages.md").read_text(encoding="utf-8")
    assert node_argument_problems(page, source) == []
    made_up = "Every hook gets:\n\n| `abort` | |\n\nAnd per hook:\n\n| `processInput` | `messages` | x |\n"
    problems = node_argument_problems(made_up, source)
    assert "docs/other-languages.md: no hook argument onFailure" in problems
    assert "docs/other-languages.md: processInput takes messageList, unnamed" in problems
