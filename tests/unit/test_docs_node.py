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


def node_setting_problems(page: str, settings: str, sources: str) -> list[str]:
    """The Node SDK's settings table (docs/other-languages.md) names every flag of
    lib/settings.js, and the page every PROCMESH_* variable the SDK's lib/ reads: by its name, or
    as a row's `_SUFFIX` after a first variable it extends (`PROCMESH_TLS_CERT`, `_KEY`)."""
    table = page.split("| env | flag / option | default |", 1)[1].split("\n\n", 1)[0]
    flags = re.findall(r"\['(--[\w-]+)', '\w+'", settings)
    problems = [
        f"docs/other-languages.md: the Node settings table lacks {f}" for f in flags if f"`{f}" not in table
    ]
    shortened = set()
    for line in page.splitlines():
        first = re.search(r"`(PROCMESH_[A-Z_]+)`", line)
        for suffix in re.findall(r"`(_[A-Z_]+)`", line) if first else []:
            shortened |= {first[1] + suffix, first[1].rsplit("_", 1)[0] + suffix}
    for name in sorted(set(re.findall(r"\bPROCMESH_[A-Z]+(?:_[A-Z]+)*\b", sources))):
        if not re.search(rf"\b{name}\b", page) and name not in shortened:
            problems.append(f"docs/other-languages.md: the Node SDK reads {name}, unnamed")
    return problems


def test_the_node_settings_table_names_every_setting() -> None:
    settings = (NODE / "lib" / "settings.js").read_text(encoding="utf-8")
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (NODE / "lib").rglob("*.js"))
    page = (REPO / "docs" / "other-languages.md").read_text(encoding="utf-8")
    assert "--grace-seconds" in settings
    assert node_setting_problems(page, settings, sources) == []
    made_up = "| env | flag / option | default |\n|---|---|---|\n| `PROCMESH_LISTEN` | `--listen` | |\n"
    problems = node_setting_problems(made_up, settings, sources)
    assert "docs/other-languages.md: the Node settings table lacks --grace-seconds" in problems
    assert "docs/other-languages.md: the Node SDK reads PROCMESH_MODEL_GATEWAY, unnamed" in problems


def node_default_problems(page: str, settings: str) -> list[str]:
    """A row of the Node settings table whose option has a default in lib/settings.js (its
    `const settings = {addresses: [...], graceSeconds: 10, ...}`) gives that default."""
    literal = re.search(r"const settings = \{(.*?)\};", settings)
    assert literal is not None, "lib/settings.js: no `const settings = {...}` of defaults"
    defaults = {
        key: value.strip("[]'")
        for key, value in re.findall(r"(\w+): (\['[^']*'\]|'[^']*'|[\d.]+|true|false)", literal[1])
    }
    table = page.split("| env | flag / option | default |", 1)[1].split("\n\n", 1)[0]
    problems = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        options = re.findall(r"`(\w+)`", cells[1].rsplit(" / ", 1)[-1]) if len(cells) == 3 else []
        for option in (o for o in options if o in defaults):
            said = cells[2].replace("`", "").split(" (")[0].strip()
            if said != defaults[option]:
                problems.append(
                    f"docs/other-languages.md: {option} defaults to {defaults[option]}, not {said}"
                )
    return problems


def test_the_node_settings_table_gives_the_defaults() -> None:
    settings = (NODE / "lib" / "settings.js").read_text(encoding="utf-8")
    page = (REPO / "docs" / "other-languages.md").read_text(encoding="utf-8")
    assert "graceSeconds: 10" in settings  # the defaults are where the check reads them
    assert node_default_problems(page, settings) == []
    made_up = (
        "| env | flag / option | default |\n|---|---|---|\n"
        "| `PROCMESH_LISTEN` | `--listen ADDR` / `address`, `addresses` | `127.0.0.1:50052` |\n"
        "| `PROCMESH_GRACE_SECONDS` | `--grace-seconds S` / `graceSeconds` | `10` |\n"
        "| `PROCMESH_LOG_LEVEL` | `--log-level L` / `logLevel` | `DEBUG` |\n"
    )
    assert node_default_problems(made_up, settings) == [
        "docs/other-languages.md: addresses defaults to 127.0.0.1:50051, not 127.0.0.1:50052",
        "docs/other-languages.md: logLevel defaults to INFO, not DEBUG",
    ]
