"""docs/builtins.md's option tables hold: under each built-in's heading (`## token-limiter`), every
option a `| option | default |` table names is a field of that processor's `Options` model, and
its default is the field's (`required` for a required one; a list written as its items); and
every option of every built-in is named (builtins.md, or configuration.md for the default error
processors); and every built-in has a section of its own (a heading or bold lead of builtins.md,
or an item of configuration.md's default error processors).

The truth is the processors themselves (procmesh_sidecars' sets); a renamed option or a changed
default leaves the page telling users to write a key the processor refuses.
`test_the_check_catches_made_up_options` feeds it a made-up page.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from procmesh import Processor
from tests.conftest import REPO
from tests.unit.test_docs_reference import spellings, table_rows


def builtin_processors() -> dict[str, Processor]:
    """Every built-in processor and default error processor, by id."""
    from procmesh_sidecars import builtins, error_defaults

    found = {p.id: p for make in builtins.SETS.values() for p in make()}
    return found | {p.id: p for p in error_defaults.processors()}


def _said(cell: str, default: Any) -> bool:
    """Whether a table's default cell gives `default`: its text before any parenthesis, or for a
    list its items in backticks (`a`, `b`) or as one YAML list (`[a, b]`)."""
    if isinstance(default, list) and default:
        items = re.findall(r"`([^`]+)`", cell)
        return items == [str(v) for v in default] or (len(items) == 1 and yaml.safe_load(items[0]) == default)
    return cell.replace("`", "").split(" (")[0].strip() in spellings(default)


def option_problems(text: str, processors: dict[str, Processor]) -> list[str]:
    """Every option of a table under a built-in's heading is one its `Options` model has, with the
    model's default (a row naming several options, or a nested one, is checked for its names)."""
    problems = []
    for part in re.split(r"^#{2,3} ", text, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        processor = processors.get(heading.strip())
        options = getattr(processor, "Options", None)
        if options is None:
            continue
        fields = {field.alias or name: field for name, field in options.model_fields.items()}
        for row in table_rows(body):
            keys = re.findall(r"`([\w.]+)`", row.get("option", ""))
            for key in keys:
                field = fields.get(key.split(".")[0])
                if field is None:
                    problems.append(f"docs/builtins.md: {heading}: no option {key}")
                    continue
                if len(keys) > 1 or "." in key:
                    continue  # several options in one row: their names only
                cell = row["default"]
                if field.is_required():
                    wrong = not cell.startswith("required")
                else:
                    default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
                    wrong = default not in (None, "") and not _said(cell, default)
                if wrong:
                    problems.append(f"docs/builtins.md: {heading}: {key}'s default is not {cell!r}")
    return problems


def test_the_option_tables_give_real_options_and_defaults() -> None:
    processors = builtin_processors()
    assert {"token-limiter", "moderation", "pii-detector"} <= set(processors)
    text = (REPO / "docs" / "builtins.md").read_text(encoding="utf-8")
    assert len([r for r in table_rows(text) if "option" in r]) >= 30  # the tables were found
    assert option_problems(text, processors) == []


def test_the_check_catches_made_up_options() -> None:
    page = (
        "## token-limiter\n\n| option | default |\n|---|---|\n| `limit` | `4000` |\n"
        "| `strategy` | `abort` |\n| `frob` | `1` |\n\n"
        "## unicode-normalizer\n\n| option | default | |\n|---|---|---|\n"
        "| `trim` | `true` | |\n| `strip_control_chars` | `true` | |\n"
    )
    assert option_problems(page, builtin_processors()) == [
        "docs/builtins.md: token-limiter: limit's default is not '`4000`'",
        "docs/builtins.md: token-limiter: strategy's default is not '`abort`'",
        "docs/builtins.md: token-limiter: no option frob",
        "docs/builtins.md: unicode-normalizer: strip_control_chars's default is not '`true`'",
    ]


def unnamed_options(text: str, processors: dict[str, Processor]) -> list[str]:
    """Every option of every built-in is named on the pages (`name` in backticks, or `name:` or
    `name.` in one): an option added without a word is one no user finds."""
    return [
        f"{pid}: option {key} is named nowhere"
        for pid, processor in sorted(processors.items())
        if processor.Options is not None
        for key in [field.alias or name for name, field in processor.Options.model_fields.items()]
        if not re.search(rf"`{re.escape(key)}[`.:= ]", text)
    ]


def test_every_option_of_a_builtin_is_documented() -> None:
    """builtins.md, or configuration.md for the default error processors' options."""
    text = "\n".join(
        (REPO / "docs" / page).read_text(encoding="utf-8") for page in ("builtins.md", "configuration.md")
    )
    processors = builtin_processors()
    assert unnamed_options(text, processors) == []
    assert unnamed_options("`limit`", {"token-limiter": processors["token-limiter"]})[:1] == [
        "token-limiter: option strategy is named nowhere"
    ]


def unsectioned(builtins_page: str, configuration_page: str, ids: set[str]) -> list[str]:
    """Every built-in has a place of its own: a heading of builtins.md (`## token-limiter`), a bold
    lead there (`**\\`steering-reminder\\`**`), or an item of configuration.md's list of the
    default error processors (`2. \\`prefill-error-handler\\``)."""
    placed = set(re.findall(r"^#{2,3} ([\w-]+)\s*$", builtins_page, flags=re.M))
    placed |= set(re.findall(r"^\*\*`([\w-]+)`\*\*", builtins_page, flags=re.M))
    defaults = configuration_page.split("## Default error processors", 1)[-1].split("\n## ", 1)[0]
    placed |= set(re.findall(r"^\d+\. `([\w-]+)`", defaults, flags=re.M))
    return [f"built-in {pid} has no section in docs/builtins.md" for pid in sorted(ids - placed)]


def test_every_builtin_has_a_section() -> None:
    builtins_page = (REPO / "docs" / "builtins.md").read_text(encoding="utf-8")
    configuration_page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    ids = set(builtin_processors())
    assert len(ids) >= 20
    assert unsectioned(builtins_page, configuration_page, ids) == []
    assert unsectioned(
        "## token-limiter\n\n**`steering-reminder`** (input lane)", "", {"token-limiter", "frob"}
    ) == ["built-in frob has no section in docs/builtins.md"]
