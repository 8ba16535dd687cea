"""Memory through `procmesh scenario run`'s runner: the scripted processors in a real sidecar process
(the Python SDK and the Node SDK), the run on a real SQLite store, traces as FORMAT.md shapes them.

Cases the public scenarios leave out: a processInput rewrite of loaded history reaches the prompt
but not the store, a window that starts with an answer, and the scripted rule order (a rule's
`when` sees what the earlier rules did).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.cli.scenario import run_scenario
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e

RUNTIMES = ["python", "node"]
ON_T1 = {"memory": {"thread": "t1", "resource": "u1"}}


async def run(tmp_path: Path, runtime: str, scenario: dict[str, Any]) -> dict[str, Any]:
    if runtime == "node":
        require_node()
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario), encoding="utf-8")
    return await run_scenario(scenario, str(path), sidecar_runtime=runtime)


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("text", "")) for m in messages]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_rewrite_of_loaded_history_reaches_the_prompt_not_the_store(
    tmp_path: Path, runtime: str
) -> None:
    rename = {"id": "rename", "processInput": [{"do": [{"replaceText": {"pattern": "Ada", "with": "A."}}]}]}
    trace = await run(
        tmp_path,
        runtime,
        {
            "name": "rewrite-loaded-history",
            "agent": {"instructions": "Hi.", "memory": {"lastMessages": 10}},
            "model": [{"text": "Hello Ada."}, {"text": "You are A."}],
            "calls": [
                {"method": "generate", "input": "I am Ada", "options": ON_T1},
                {"method": "stream", "input": "Ada again", "options": {**ON_T1, "inputProcessors": [rename]}},
            ],
        },
    )
    second = trace["calls"][1]
    assert texts(second["modelCalls"][0]["messages"]) == [
        ("system", "Hi."),
        ("user", "I am A."),
        ("assistant", "Hello A.."),
        ("user", "A. again"),
    ]
    # the loaded turn is stored once, as it was; only this call's (rewritten) input is new
    assert texts(second["memory"]["t1"]) == [
        ("user", "I am Ada"),
        ("assistant", "Hello Ada."),
        ("user", "A. again"),
        ("assistant", "You are A."),
    ]
    assert trace["calls"][0]["memorySignals"] == {"t1": []}


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_window_that_starts_with_an_answer_gets_a_placeholder_question(
    tmp_path: Path, runtime: str
) -> None:
    trace = await run(
        tmp_path,
        runtime,
        {
            "name": "odd-window",
            "agent": {"memory": {"lastMessages": 3}},
            "model": [{"text": "one"}, {"text": "two"}],
            "calls": [
                {"method": "generate", "input": "q1", "options": ON_T1},
                {"method": "generate", "input": "q2", "options": ON_T1},
                {
                    "method": "generate",
                    "input": "q3",
                    "options": {"memory": {"thread": "t2", "resource": "u1"}},
                },
            ],
        },
    )
    first, second, third = trace["calls"]
    assert texts(second["modelCalls"][0]["messages"]) == [
        ("user", "q1"),
        ("assistant", "one"),
        ("user", "q2"),
    ]
    assert first["memory"] == {
        "t1": [{"role": "user", "text": "q1"}, {"role": "assistant", "text": "one"}],
        "t2": [],
    }
    assert texts(third["modelCalls"][0]["messages"]) == [("user", "q3")]
    assert len(third["memory"]["t1"]) == 4
    assert texts(third["memory"]["t2"]) == [("user", "q3"), ("assistant", "(script exhausted)")]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_rule_sees_what_the_earlier_rules_of_its_hook_did(tmp_path: Path, runtime: str) -> None:
    ordered = {
        "id": "ordered",
        "processInput": [
            {"do": [{"count": "n"}, {"replaceText": {"pattern": "secret", "with": "[x]"}}]},
            {"when": {"stateGte": {"key": "n", "value": 1}}, "do": [{"systemMessage": "counted first"}]},
            {"when": {"textContains": "[x]"}, "do": [{"systemMessage": "saw the rewrite"}]},
            {"when": {"textContains": "secret"}, "do": [{"systemMessage": "saw the original"}]},
        ],
    }
    trace = await run(
        tmp_path,
        runtime,
        {
            "name": "rule-order",
            "agent": {"inputProcessors": [ordered]},
            "model": [{"text": "ok"}],
            "call": {"method": "generate", "input": "my secret"},
        },
    )
    assert texts(trace["modelCalls"][0]["messages"]) == [
        ("system", "counted first"),
        ("system", "saw the rewrite"),
        ("user", "my [x]"),
    ]
    assert "memory" not in trace
