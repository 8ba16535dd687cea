"""The API pages name every field and argument the code has: docs/python-api.md every field of
`CallOptions` (its table), `RunResult` (its section) and `MemoryCallOptions`; docs/processors.md
every argument the Python SDK gives every hook and each hook its own (procmesh.hooks, the table the
SDK's server decodes by); docs/other-languages.md every check procmesh-check-sidecar reports (its
source's report lines); docs/service.md the fields of a durable run's record (`GET /api/runs`) and of
a decision (`GET /api/runs/{runId}/decisions`), exactly. A field, argument or check added without a
word leaves the page short; each check reads the truth from the code and is fed a made-up page.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from procmesh_orchestrator import CallOptions, MemoryCallOptions, RunResult
from tests.conftest import REPO
from tests.unit.doc_pages import Doc

# -- the Python API --------------------------------------------------------------------------------


def unnamed_fields(cls: type, section: str) -> list[str]:
    """The dataclass's fields the section names in no code span (`run_id`, `Memory(a, b)`)."""
    spans = Doc.parse(REPO / "docs" / "python-api.md", section).spans
    return [f.name for f in dataclasses.fields(cls) if not any(re.search(rf"\b{f.name}\b", s) for s in spans)]


@pytest.mark.parametrize("cls", [CallOptions, RunResult, MemoryCallOptions], ids=lambda c: c.__name__)
def test_the_python_api_page_names_every_field(cls: type) -> None:
    """Every field of CallOptions (its table), RunResult (its section) and MemoryCallOptions."""
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    heading = "## RunResult" if cls is RunResult else "## CallOptions"
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    assert unnamed_fields(cls, section) == []
    assert unnamed_fields(cls, "`run_id`") != []


# -- hook arguments ------------------------------------------------------------------------------


def hook_argument_problems(text: str) -> list[str]:
    """docs/processors.md's "Every hook can take" table names every argument the SDK gives every
    hook (procmesh.hooks.BASE_ARGUMENTS), and its hook table's row for each hook names every
    argument of that hook's own (the SDK's one hook table, which its server decodes by)."""
    from procmesh.hooks import BASE_ARGUMENTS, HOOKS

    every = text.split("Every hook can take:", 1)[1].split("\n\n", 2)[1]
    problems = [
        f"docs/processors.md: no hook argument {a}" for a in sorted(BASE_ARGUMENTS) if f"`{a}" not in every
    ]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", text, flags=re.M))
    for hook in HOOKS:
        said = set(re.findall(r"`(\w+)`", rows.get(hook.name, "")))
        problems += [
            f"docs/processors.md: {hook.name} takes {a}, unnamed"
            for a in sorted(hook.arguments - BASE_ARGUMENTS - said)
        ]
    return problems


def test_the_processors_page_names_every_hook_argument() -> None:
    text = (REPO / "docs" / "processors.md").read_text(encoding="utf-8")
    assert hook_argument_problems(text) == []
    made_up = "Every hook can take:\n\n| `abort` | |\n\nHooks:\n\n| `process_input` | `messages` | a list |\n"
    problems = hook_argument_problems(made_up)
    assert "docs/processors.md: no hook argument model" in problems
    assert "docs/processors.md: process_input takes message_list, unnamed" in problems
    assert "docs/processors.md: process_input takes messages, unnamed" not in problems


# -- the contract checker's checks -----------------------------------------------------------------

PLACEHOLDERS = {
    "pid": "<id>",
    "STREAM": "ProcessOutputStream",
    "hook": "<RPC>",
    "first": "<a>",
    "second": "<b>",
}
"""How the checks table writes the names the checker fills in."""


def _rendered(node: ast.expr) -> str | None:
    """A check's name as the table writes it (`f"{pid}: state round-trip"` -> `<id>: state
    round-trip`); None when it holds a value the table does not name (`{what}`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    out = ""
    for value in node.values:
        if isinstance(value, ast.Constant):
            out += str(value.value)
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
            if value.value.id not in PLACEHOLDERS:
                return None
            out += PLACEHOLDERS[value.value.id]
        else:
            return None
    return out


def checker_checks() -> set[str]:
    """The checks procmesh-check-sidecar reports: each `report.check(...)` and `still_serving(...)`
    name of sdk/procmesh/_check (through a `name = ...` the call passes)."""
    found = set()
    for path in (REPO / "sdk" / "procmesh" / "_check").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        named = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["name"]
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("check", "still_serving"):
                first = node.args[0] if node.args else None
                given = named if isinstance(first, ast.Name) and first.id == "name" else [first]
                found |= {r for r in map(_rendered, [g for g in given if g is not None]) if r}
    return found


def unlisted_checks(page: str, checks: set[str]) -> list[str]:
    """The checks the page's `## procmesh-check-sidecar` section names nowhere (a fused stream's
    check is the table's `fused <RPC> [<a>, <b>]`)."""
    section = page.split("## procmesh-check-sidecar", 1)[1].split("\n## ", 1)[0]
    return sorted(
        c for c in checks if f"`{c.replace('fused ProcessOutputStream', 'fused <RPC>')}`" not in section
    )


def test_the_checker_page_lists_every_check() -> None:
    checks = checker_checks()
    assert {"health", "Describe", "<id>: state round-trip", "<id> <RPC>: valid requests"} <= checks  # read
    page = (REPO / "docs" / "other-languages.md").read_text(encoding="utf-8")
    assert unlisted_checks(page, checks) == []
    assert unlisted_checks("## procmesh-check-sidecar\n\n| `health` | |\n", {"health", "hosted tools"}) == [
        "hosted tools"
    ]


# -- the HTTP API's record shapes ------------------------------------------------------------------


def listed_keys(text: str, route: str) -> set[str]:
    """The keys of the records a route's row lists in its `{..., name: [{a, b}]}` answer."""
    row = next(line for line in text.splitlines() if line.startswith(f"| `{route}` |"))
    items = re.search(r"\[\{([^{}\]]+)\}\]", row)
    assert items is not None, row
    return {name.strip() for name in items[1].split(",")}


def shown_record_keys() -> dict[str, set[str]]:
    """What the code shows of a durable run (`GET /api/runs`) and of a decision (a run's record)."""
    from procmesh_orchestrator.service.http.runs import run_json
    from procmesh_orchestrator.store.decisions import Decision
    from procmesh_orchestrator.store.runs import DurableRun

    decision = Decision(**{f.name: None for f in dataclasses.fields(Decision)})
    return {
        "GET /api/runs": set(run_json(DurableRun(run_id="r", agent_id="a"))),
        "GET /api/runs/{runId}/decisions": set(decision.to_json()),
    }


@pytest.mark.parametrize("route", sorted(shown_record_keys()))
def test_the_service_page_lists_the_records_fields(route: str) -> None:
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    assert listed_keys(text, route) == shown_record_keys()[route]


def test_the_record_check_reads_the_rows_list() -> None:
    made_up = "| `GET /api/runs` | `page` | `{runs: [{runId, agentId, colour}], total}`, newest first |\n"
    assert listed_keys(made_up, "GET /api/runs") == {"runId", "agentId", "colour"}
    assert listed_keys(made_up, "GET /api/runs") != shown_record_keys()["GET /api/runs"]
