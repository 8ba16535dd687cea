"""The scenario runner refuses what FORMAT.md does not define, naming its path (an ignored key
would run the scenario as if it were absent: a wrong trace, exit 0)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from procmesh_orchestrator.cli import scenario_keys
from procmesh_orchestrator.errors import ScenarioError

CHECKER = {
    "id": "checker",
    "processInput": [
        {"do": [{"count": "n"}]},
        {
            "when": {"textContains": "x", "stateGte": {"key": "n", "value": 2}},
            "do": [{"abort": {"reason": "r", "retry": True, "metadata": {"k": 1}}}],
        },
        {"do": [{"replaceText": {"pattern": "a", "with": "b"}}, {"systemMessage": "s"}]},
    ],
    "processInputStep": [{"do": [{"signal": {"contents": "c", "attributes": {}, "transient": True}}]}],
    "onViolation": False,
}
VALID: dict[str, Any] = {
    "name": "every-key",
    "description": "free text",
    "divergesFromReference": "why",
    "agent": {
        "instructions": "Be brief.",
        "maxSteps": 3,
        "maxProcessorRetries": 1,
        "errorProcessorDefaults": False,
        "stopWhen": [{"stepCountIs": 2}, {"hasToolCall": "weather"}],
        "memory": {"lastMessages": 4},
        "inputProcessorsByContext": {"key": "tenant", "cases": {"acme": [CHECKER]}, "default": []},
        "outputProcessors": [{"id": "out", "processOutputStream": []}],
        "errorProcessors": [{"id": "err", "processAPIError": []}],
    },
    "model": [
        {"text": "hi", "usage": {"inputTokens": 1, "outputTokens": 2}},
        {"deltas": ["a", "b"], "toolCalls": [{"name": "weather", "args": {}}], "finishReason": "stop"},
        {"error": {"status": 500, "message": "m", "retryable": True}},
    ],
    "tools": {"weather": {"description": "d", "result": {"t": 1}, "custom": {"type": "data-x", "data": {}}}},
    "calls": [
        {
            "method": "stream",
            "input": [{"role": "system", "text": "s"}, {"role": "user", "text": "hello"}],
            "options": {
                "maxSteps": 2,
                "maxProcessorRetries": 0,
                "stopWhen": [{"stepCountIs": 1}],
                "requestContext": {"tenant": "acme"},
                "memory": {"thread": "t1", "resource": "u1"},
                "inputProcessors": [CHECKER],
            },
        }
    ],
}


def with_change(path: list[str | int], value: Any) -> dict[str, Any]:
    scenario = copy.deepcopy(VALID)
    node: Any = scenario
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return scenario


def test_every_key_the_format_defines_is_accepted() -> None:
    scenario_keys.check(VALID)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (["stopWhen"], "unknown key stopWhen"),
        (["agent", "stopWhenn"], "unknown key agent.stopWhenn"),
        (["agent", "memory", "last"], "unknown key agent.memory.last"),
        (
            ["agent", "outputProcessors", 0, "procesOutputStream"],
            "agent.outputProcessors.0.procesOutputStream",
        ),
        (["agent", "inputProcessorsByContext", "otherwise"], "agent.inputProcessorsByContext.otherwise"),
        (
            ["agent", "inputProcessorsByContext", "cases", "acme", 0, "when"],
            "agent.inputProcessorsByContext.cases.acme.0.when",
        ),
        (["tools", "weather", "args"], "unknown key tools.weather.args"),
        (["calls", 0, "stream"], "unknown key calls.0.stream"),
        (["calls", 0, "options", "inputProcessorsByContext"], "calls.0.options.inputProcessorsByContext"),
        (["calls", 0, "options", "memory", "user"], "calls.0.options.memory.user"),
        (["calls", 0, "input", 1, "content"], "calls.0.input.1.content"),
        (["tools", "weather", "custom", "dat"], "tools.weather.custom.dat"),
        (
            ["agent", "inputProcessorsByContext", "cases", "acme", 0, "processInput", 0, "then"],
            ".processInput.0.then",
        ),
        (
            ["calls", 0, "options", "inputProcessors", 0, "processInput", 1, "when", "textContain"],
            ".when.textContain",
        ),
        (
            ["calls", 0, "options", "inputProcessors", 0, "processInput", 1, "when", "stateGte", "gte"],
            "stateGte.gte",
        ),
        (
            ["calls", 0, "options", "inputProcessors", 0, "processInput", 1, "do", 0, "abort", "retyr"],
            "abort.retyr",
        ),
        (
            ["calls", 0, "options", "inputProcessors", 0, "processInputStep", 0, "do", 0, "signal", "tag"],
            "signal.tag",
        ),
    ],
)
def test_an_unknown_key_is_refused_naming_its_path(path: list[str | int], named: str) -> None:
    with pytest.raises(ScenarioError, match="unknown key") as info:
        scenario_keys.check(with_change(path, 1))
    assert named in str(info.value)


def test_a_static_lane_beside_one_chosen_by_context_is_refused() -> None:
    with pytest.raises(ScenarioError, match="give inputProcessors or inputProcessorsByContext, not both"):
        scenario_keys.check(with_change(["agent", "inputProcessors"], []))


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (["agent", "stopWhen"], [{"stepCountIs": 0}], "agent.stopWhen[0]"),
        (["calls", 0, "options", "stopWhen"], "soon", "calls.0.options.stopWhen must be a list"),
        (["agent", "inputProcessorsByContext", "key"], "", "agent.inputProcessorsByContext.key"),
        (["agent", "outputProcessors"], {"id": "x"}, "agent.outputProcessors: expected a list"),
        (["model", 1, "toolCall"], [], "model.1.toolCall: Extra inputs are not permitted"),
        (["model", 1, "toolCalls", 0, "arguments"], {}, "model.1.toolCalls.0.arguments"),
        (["model", 2, "error", "retry"], True, "model.2.error.retry"),
        (["calls", 0, "method"], "steam", "calls.0.method: generate or stream, got 'steam'"),
        (["calls", 0, "input", 0, "role"], "tool", "calls.0.input.0: {role: user | assistant | system"),
        (["calls", 0, "options", "requestContext", "tier"], 2, "requestContext: an object of string values"),
        (["calls", 0, "options", "memory", "thread"], 7, "calls.0.options.memory: thread and resource"),
        (
            ["agent", "inputProcessorsByContext", "cases", "acme", 0, "processInput", 0, "do", 0],
            {"count": "n", "drop": True},
            "processInput.0.do.0: an action is one of",
        ),
        (
            ["calls", 0, "options", "inputProcessors", 0, "processInput", 0, "do", 0],
            {"shout": 1},
            "got shout",
        ),
    ],
)
def test_a_malformed_value_is_refused_naming_its_path(path: list[str | int], value: Any, named: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_keys.check(with_change(path, value))
    assert named in str(info.value)


RULE = ["calls", 0, "options", "inputProcessors", 0, "processInput", 1]


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ([*RULE, "when", "textContains"], 5, ".when.textContains: a string, got 5"),
        ([*RULE, "when", "textMatches"], "(", ".when.textMatches: a regular expression"),
        ([*RULE, "when", "stepNumber"], "1", '.when.stepNumber: an integer, got "1"'),
        ([*RULE, "when", "retryCountLt"], True, ".when.retryCountLt: an integer, got true"),
        ([*RULE, "when", "stateGte", "value"], "2", '.when.stateGte.value: an integer, got "2"'),
        ([*RULE, "when", "stateGte", "key"], 5, ".when.stateGte.key: a state key (a string), got 5"),
        ([*RULE, "when", "stepNumberGte"], 1.5, ".when.stepNumberGte: an integer, got 1.5"),
        ([*RULE, "when", "partType"], 5, ".when.partType: a string, got 5"),
        ([*RULE, "when", "errorStatus"], "500", '.when.errorStatus: an integer, got "500"'),
        ([*RULE, "do", 0], {"drop": False}, ".do.0.drop: true, got false"),
        ([*RULE, "do", 0], {"retry": 1}, ".do.0.retry: true, got 1"),
        ([*RULE, "do", 0], {"count": ""}, ".do.0.count: a state key"),
        ([*RULE, "do", 0], {"toolChoice": "never"}, ".do.0.toolChoice: auto | none | required"),
        (
            [*RULE, "do", 0],
            {"toolChoice": {"type": "tool", "toolName": "w", "strict": True}},
            ".do.0.toolChoice: auto | none | required or {type: tool, toolName}",
        ),
        ([*RULE, "do", 0], {"systemMessage": 5}, ".do.0.systemMessage: a string, got 5"),
        ([*RULE, "do", 0], {"metadata": []}, ".do.0.metadata: an object, got []"),
        ([*RULE, "do", 0], {"abort": {"reason": 5}}, ".do.0.abort.reason: a string, got 5"),
        ([*RULE, "do", 0], {"abort": {"reason": "r", "metadata": 1}}, ".do.0.abort.metadata: an object"),
        ([*RULE, "do", 0], {"replaceText": {"pattern": "(", "with": "x"}}, ".replaceText.pattern: a regular"),
        ([*RULE, "do", 0], {"signal": {"transient": True}}, ".do.0.signal.contents: required"),
        ([*RULE, "do", 0], {"signal": {"contents": "c", "attributes": []}}, ".signal.attributes: an object"),
        (
            [*RULE, "do", 0],
            {"custom": {"type": "data-x", "dataFromState": ""}},
            ".custom.dataFromState: a state",
        ),
        ([*RULE, "do", 0], {"abort": {"reason": "r", "retry": "no"}}, ".do.0.abort.retry: a boolean"),
        ([*RULE, "do", 0], {"replaceText": {"pattern": "a"}}, ".do.0.replaceText.with: required"),
        ([*RULE, "do", 0], {"custom": {"type": "x", "data": {}}}, ".do.0.custom.type: a data-* chunk type"),
        ([*RULE, "do", 0], {"custom": {"type": "data-x"}}, ".do.0.custom: give data or dataFromState"),
        ([*RULE, "do", 0], {"signal": {"contents": "c", "transient": "yes"}}, ".signal.transient: a boolean"),
        (["agent", "outputProcessors", 0, "processDataParts"], "false", "processDataParts: a boolean"),
        (["agent", "outputProcessors", 0, "speculative"], 1, "outputProcessors.0.speculative: a boolean"),
        (["agent", "outputProcessors", 0, "id"], "", "agent.outputProcessors.0.id: a non-empty string"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_its_path(
    path: list[str | int], value: Any, named: str
) -> None:
    # the scripted sidecar compares values as given: each would run with exit 0 and a wrong trace
    with pytest.raises(ScenarioError) as info:
        scenario_keys.check(with_change(path, value))
    assert named in str(info.value)


def test_lane_specs_include_every_case_and_the_default() -> None:
    source = {
        "inputProcessors": [{"id": "a"}],
        "outputProcessorsByContext": {"key": "k", "cases": {"x": [{"id": "b"}]}, "default": [{"id": "c"}]},
    }
    assert [s["id"] for s in scenario_keys.lane_specs(source)] == ["a", "b", "c"]
