"""The status codes the contract page says the orchestrator retries are the ones its channel
retries: proto/README.md's status-code table marks a code "the orchestrator retries" exactly when
`procmesh._client.SERVICE_CONFIG` retries hooks on it, and "not `ExecuteTool`" exactly when the
tool's policy leaves it out.

`test_the_check_catches_made_up_retries` feeds the check a made-up table.
"""

from __future__ import annotations

import re

from procmesh._client import SERVICE_CONFIG
from tests.conftest import REPO


def retried_codes() -> tuple[set[str], set[str]]:
    """The codes a hook's call is retried on, and those an `ExecuteTool` call is."""
    hooks: set[str] = set()
    tool: set[str] = set()
    for config in SERVICE_CONFIG["methodConfig"]:
        codes = set(config["retryPolicy"]["retryableStatusCodes"])
        methods = {n["method"] for n in config["name"]}
        if "ExecuteTool" in methods:
            tool |= codes
        if methods - {"ExecuteTool"}:
            hooks |= codes
    return hooks, tool


def retry_problems(text: str, hooks: set[str], tool: set[str]) -> list[str]:
    """What the status-code table (rows `| \\`CODE\\` | when ... |`) says is retried, against the
    channel's policies."""
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (.*) \|$", text, flags=re.M))
    said = {code for code, row in rows.items() if "orchestrator retries" in row}
    said_not_tool = {code for code, row in rows.items() if "not `ExecuteTool`" in row}
    problems = []
    for code in sorted(hooks ^ said):
        which = "retries" if code in hooks else "does not retry"
        problems.append(f"proto/README.md: the channel {which} a hook on {code}; the table says otherwise")
    for code in sorted((hooks - tool) ^ said_not_tool):
        problems.append(f"proto/README.md: {code} and ExecuteTool: the table's 'not `ExecuteTool`' is wrong")
    return problems


def test_the_status_table_says_which_codes_are_retried() -> None:
    hooks, tool = retried_codes()
    assert hooks  # the policies are where the check reads them
    assert tool <= hooks
    text = (REPO / "proto" / "README.md").read_text(encoding="utf-8")
    assert retry_problems(text, hooks, tool) == []


def test_the_check_catches_made_up_retries() -> None:
    table = (
        "| code | when |\n|---|---|\n"
        "| `UNAVAILABLE` | starting, so the orchestrator retries a unary hook |\n"
        "| `CANCELLED` | stopped mid-call |\n"
        "| `INTERNAL` | the hook raised; the orchestrator retries it, not `ExecuteTool` |\n"
    )
    assert retry_problems(table, {"UNAVAILABLE", "CANCELLED"}, {"UNAVAILABLE"}) == [
        "proto/README.md: the channel retries a hook on CANCELLED; the table says otherwise",
        "proto/README.md: the channel does not retry a hook on INTERNAL; the table says otherwise",
        "proto/README.md: CANCELLED and ExecuteTool: the table's 'not `ExecuteTool`' is wrong",
        "proto/README.md: INTERNAL and ExecuteTool: the table's 'not `ExecuteTool`' is wrong",
    ]
