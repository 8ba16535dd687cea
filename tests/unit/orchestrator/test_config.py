"""The YAML/pydantic configuration: what loads, and errors that name the key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.config import Config, load_config, parse_config
from procmesh_orchestrator.config.conditions import Call, check_when, decided_per_call, when_holds
from procmesh_orchestrator.errors import ConfigError

VALID_YAML = """
sidecars:
  guards:
    address: unix:///run/procmesh/guards.sock
  filters:
    address: 127.0.0.1:50061
    timeout: 0.5
    onFailure: fail-open
models:
  script:
    provider: scripted
    responses:
      - text: hello there
    delayMs: 5
tools:
  weather:
    description: The weather
    result: {temp: 21}
agents:
  helper:
    instructions: Be brief.
    model: script
    tools: [weather]
    maxSteps: 3
    maxProcessorRetries: 2
    inputProcessors:
      - guards/pii-redactor
      - processor: guards/topic-guard
        options: {words: [jailbreak]}
        timeout: 2
    outputProcessors:
      - processor: filters/word-filter
        onFailure: fail-closed
"""


def base(**agent: Any) -> dict[str, Any]:
    """A minimal valid config; `agent` keys override the agent's."""
    return {
        "sidecars": {"s": {"address": "127.0.0.1:50051"}},
        "agents": {"a": {"model": "demo", **agent}},
    }


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test config")
    message = str(info.value)
    assert message.startswith("invalid test config:"), message
    return message


def test_valid_yaml_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "procmesh.yaml"
    path.write_text(VALID_YAML, encoding="utf-8")
    config = load_config(path)
    assert isinstance(config, Config)
    guards, filters = config.sidecars["guards"], config.sidecars["filters"]
    assert (guards.timeout, guards.on_failure) == (5.0, "fail-closed")  # defaults
    assert (filters.timeout, filters.on_failure) == (0.5, "fail-open")
    assert config.models["script"].responses == [{"text": "hello there"}]
    assert config.models["script"].delay_ms == 5
    assert config.tools["weather"].result == {"temp": 21}
    agent = config.agents["helper"]
    assert (agent.max_steps, agent.max_processor_retries, agent.tools) == (3, 2, ["weather"])
    assert agent.error_processor_defaults is True
    first, second = agent.input_processors
    assert (first.sidecar, first.processor_id, first.options, first.timeout) == (
        "guards",
        "pii-redactor",
        {},
        None,
    )
    assert (second.processor_id, second.options, second.timeout) == (
        "topic-guard",
        {"words": ["jailbreak"]},
        2,
    )
    assert agent.output_processors[0].on_failure == "fail-closed"
    assert agent.error_processors == []


def test_defaults_give_the_demo_model() -> None:
    config = parse_config({"agents": {"a": {"model": "demo"}}})
    assert config.models["demo"].provider == "demo"
    assert config.sidecars == {}


def test_snake_case_keys_are_accepted_too() -> None:
    config = parse_config(base(max_steps=2, input_processors=["s/p"]))
    assert config.agents["a"].max_steps == 2
    assert config.agents["a"].input_processors[0].processor == "s/p"


def test_unknown_sidecar_in_a_lane_names_agent_lane_and_index() -> None:
    message = error_of(base(outputProcessors=["s/ok", "ghost/word-filter"]))
    assert "agents.a.outputProcessors.1" in message
    assert "unknown sidecar 'ghost'" in message


@pytest.mark.parametrize(
    ("address", "problem"),
    [("localhost", "host:port"), ("", "host:port"), ("unix://", "needs a path")],
)
def test_bad_address_names_the_sidecar(address: str, problem: str) -> None:
    data = base()
    data["sidecars"]["s"]["address"] = address
    line = next(ln for ln in error_of(data).splitlines() if "sidecars.s.address" in ln)
    assert problem in line


def test_unknown_model_names_the_agent() -> None:
    message = error_of(base(model="nope"))
    assert "agents.a.model" in message
    assert "'nope'" in message


def test_unknown_tool_names_the_agent() -> None:
    message = error_of(base(tools=["hammer"]))
    assert "agents.a.tools" in message
    assert "'hammer'" in message


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({**base(), "sidecarz": {}}, "sidecarz"),
        (base(maxStepz=3), "agents.a.maxStepz"),
        (base(inputProcessors=[{"processor": "s/p", "option": {}}]), "agents.a.inputProcessors.0.option"),
        # a scripted response and a tool's custom chunk: read by key, so a misspelt one was dropped
        (
            {
                **base(),
                "models": {"m": {"provider": "scripted", "responses": [{"text": "a"}, {"toolCall": []}]}},
            },
            "1.toolCall",
        ),
        (
            {**base(), "models": {"m": {"provider": "scripted", "responses": [{"tool_calls": []}]}}},
            "0.tool_calls",  # the model reads toolCalls only: no snake_case twin here
        ),
        (
            {**base(), "models": {"m": {"provider": "scripted", "responses": [{"error": {"retry": True}}]}}},
            "0.error.retry",
        ),
        (
            {
                **base(),
                "models": {
                    "m": {"provider": "scripted", "responses": [{"toolCalls": [{"name": "t", "input": {}}]}]}
                },
            },
            "0.toolCalls.0.input",
        ),
        (
            {**base(), "tools": {"t": {"result": 1, "custom": {"type": "data-x", "dat": {}}}}},
            "tools.t.custom.dat",
        ),
    ],
)
def test_extra_key_is_named(data: dict[str, Any], where: str) -> None:
    message = error_of(data)
    assert f"{where}: Extra inputs are not permitted" in message, message


def test_every_key_a_scripted_response_has_is_accepted() -> None:
    response = {
        "text": "a",
        "deltas": ["a"],
        "toolCalls": [{"name": "t", "args": {"x": 1}}],
        "error": {"status": 500, "message": "m", "retryable": True, "body": "b"},
        "usage": {"inputTokens": 1, "outputTokens": 2},
        "finishReason": "length",
    }
    config = parse_config(
        {**base(model="m"), "models": {"m": {"provider": "scripted", "responses": [response]}}}
    )
    assert config.models["m"].responses == [response]  # the model reads it as given


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"sidecars": {"s": {"address": "127.0.0.1:1", "timeout": -1}}}, "sidecars.s.timeout"),
        ({"sidecars": {"s": {"address": "127.0.0.1:1", "timeout": 0}}}, "sidecars.s.timeout"),
        (
            {"agents": {"a": {"model": "demo", "inputProcessors": [{"processor": "s/p", "timeout": -0.5}]}}},
            "agents.a.inputProcessors.0.timeout",
        ),
    ],
)
def test_non_positive_timeout_is_named(patch: dict[str, Any], where: str) -> None:
    message = error_of({**base(), **patch})
    assert f"{where}: Input should be greater than 0" in message


def test_bad_failure_policy_and_ref_shape_are_named_together() -> None:
    data = base(inputProcessors=["no-slash"])
    data["sidecars"]["s"]["onFailure"] = "fail-sometimes"
    message = error_of(data)
    assert "sidecars.s.onFailure" in message
    assert "'fail-closed'" in message
    assert "agents.a.inputProcessors.0.processor" in message
    assert "'sidecar/processor-id'" in message


def test_negative_max_steps_is_named() -> None:
    assert "agents.a.maxSteps" in error_of(base(maxSteps=0))


def test_a_tool_call_concurrency_below_one_is_named() -> None:
    assert "agents.a.toolCallConcurrency" in error_of(base(toolCallConcurrency=0))
    assert parse_config(base(), "t").agents["a"].tool_call_concurrency == 10  # the reference's default


def test_missing_agents_is_named() -> None:
    assert "agents: Field required" in error_of({"sidecars": {}})


def test_load_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read config") as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_load_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("agents: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("text", ["", "- a list\n", "just a string\n"])
def test_load_non_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_load_reports_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "procmesh.yaml"
    path.write_text("agents:\n  a:\n    model: demo\n    maxSteps: -1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "agents.a.maxSteps" in str(info.value)


def test_env_overrides_set_nested_keys_matching_case_and_underscores(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "sidecars:\n  guards: {address: 'unix:///a.sock'}\n"
        "agents:\n  a: {model: demo, maxSteps: 5, inputProcessors: [guards/x]}\n"
    )
    env = {
        "PROCMESH_CONFIG__SIDECARS__GUARDS__ADDRESS": "unix:///run/procmesh/guards.sock",
        "PROCMESH_CONFIG__AGENTS__A__MAX_STEPS": "3",
        "PROCMESH_CONFIG__AGENTS__A__INSTRUCTIONS": "Be brief.",
        "PROCMESH_API_KEYS": "not a config override",
    }
    cfg = load_config(path, environ=env)
    assert cfg.sidecars["guards"].address == "unix:///run/procmesh/guards.sock"
    assert cfg.agents["a"].max_steps == 3
    assert cfg.agents["a"].instructions == "Be brief."


def test_env_override_errors_are_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("agents:\n  a: {model: demo}\n")
    with pytest.raises(
        ConfigError, match=r"PROCMESH_CONFIG__AGENTS__A__MODEL__X: agents\.a\.model is not a mapping"
    ):
        load_config(path, environ={"PROCMESH_CONFIG__AGENTS__A__MODEL__X": "1"})
    with pytest.raises(ConfigError, match=r"agents\.a\.maxSteps"):
        load_config(path, environ={"PROCMESH_CONFIG__AGENTS__A__MAX_STEPS": "0"})


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path) -> None:
    # PyYAML keeps the last of two equal keys: two agents of one name would silently leave one
    path = tmp_path / "twice.yaml"
    path.write_text(
        "agents:\n  a:\n    model: demo\n    inputProcessors: [guards/ban]\n  a:\n    model: demo\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="duplicate key 'a' \\(first given on line 2\\)") as info:
        load_config(path)
    assert "line 5" in str(info.value)


def test_an_env_override_value_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("agents:\n  a:\n    model: demo\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="duplicate key 'x'"):
        load_config(path, {"PROCMESH_CONFIG__AGENTS__A__METADATA": "{x: 1, x: 2}"})


def test_a_lane_chosen_from_the_request_context_loads_with_every_case() -> None:
    by_tenant = {"key": "tenant", "cases": {"acme": ["s/strict", "s/pii"]}, "default": ["s/basic"]}
    config = parse_config(base(inputProcessorsByContext=by_tenant), "test config")
    agent = config.agents["a"]
    assert agent.input_processors == []
    assert [r.processor for r in agent.possible_entries("input")] == ["s/strict", "s/pii", "s/basic"]
    assert [lane for lane, _ in agent.named_lanes()][-2:] == [
        "inputProcessorsByContext.cases.acme",
        "inputProcessorsByContext.default",
    ]


def test_a_static_lane_and_one_chosen_from_the_context_are_refused_together() -> None:
    by_tenant = {"key": "tenant", "cases": {}}
    message = error_of(base(outputProcessors=["s/a"], outputProcessorsByContext=by_tenant))
    assert "give outputProcessors or outputProcessorsByContext, not both" in message


@pytest.mark.parametrize(
    ("by_context", "where"),
    [
        ({"key": "tenant", "cases": {"acme": ["ghost/x"]}}, "inputProcessorsByContext.cases.acme.0"),
        (
            {"key": "tenant", "cases": {}, "default": ["s/ok", "ghost/x"]},
            "inputProcessorsByContext.default.1",
        ),
    ],
)
def test_an_unknown_sidecar_in_a_case_is_named_with_its_case(by_context: dict[str, Any], where: str) -> None:
    message = error_of(base(inputProcessorsByContext=by_context))
    assert f"agents.a.{where}: unknown sidecar 'ghost'" in message


@pytest.mark.parametrize(
    ("by_context", "where"),
    [
        ({"key": "", "cases": {}}, "inputProcessorsByContext.key"),
        ({"key": "tenant", "cases": {}, "otherwise": []}, "inputProcessorsByContext.otherwise"),
        ({"cases": {}}, "inputProcessorsByContext.key"),
    ],
)
def test_a_malformed_context_lane_is_named(by_context: dict[str, Any], where: str) -> None:
    assert f"agents.a.{where}" in error_of(base(inputProcessorsByContext=by_context))


def test_one_processor_twice_in_a_lane_is_refused_unless_each_has_a_name() -> None:
    message = error_of(base(inputProcessors=["s/ban", {"processor": "s/ban", "options": {"words": ["x"]}}]))
    assert (
        "agents.a.inputProcessors.1: processor instance 'ban' is already at agents.a.inputProcessors.0"
        in message
    )
    named = [{"processor": "s/ban", "name": "ban-en"}, {"processor": "s/ban", "name": "ban-fr"}]
    parse_config(base(inputProcessors=named), "test config")


def test_one_instance_id_with_other_settings_in_another_lane_is_refused() -> None:
    # two entries a run would know by one id share one state and one tripwire id
    message = error_of(
        base(
            inputProcessors=["s/guard"],
            outputProcessors=[{"processor": "s/guard", "options": {"strict": True}}],
        )
    )
    assert (
        "agents.a.outputProcessors.0: processor instance 'guard' is also at agents.a.inputProcessors.0"
        in message
    )
    # the same entry in two lanes is one instance, as in the seeds (input and output hooks)
    parse_config(base(inputProcessors=["s/guard"], outputProcessors=["s/guard"]), "test config")
    # a processor and a renamed other one of the same id: the name tells them apart
    parse_config(
        base(inputProcessors=["s/guard"], outputProcessors=[{"processor": "t/guard", "name": "guard-2"}])
        | {"sidecars": {"s": {"address": "127.0.0.1:1"}, "t": {"address": "127.0.0.1:2"}}},
        "test config",
    )


def test_each_case_of_a_lane_chosen_by_context_may_give_a_processor_its_own_options() -> None:
    limiter = {"processor": "s/limit"}
    by_tenant = {
        "key": "tenant",
        "cases": {
            "acme": [{**limiter, "options": {"limit": 1}}],
            "globex": [{**limiter, "options": {"limit": 9}}],
        },
    }
    parse_config(base(inputProcessorsByContext=by_tenant), "test config")
    # but a case still meets the output lane in one call
    message = error_of(base(inputProcessorsByContext=by_tenant, outputProcessors=["s/limit"]))
    assert "processor instance 'limit' is also at agents.a.inputProcessorsByContext.cases.acme.0" in message


def test_a_workflows_processor_counts_in_the_lane_it_is_used_in() -> None:
    data = base(inputProcessors=["s/ban", "workflow:checks"])
    data["workflows"] = {"checks": {"steps": [{"parallel": ["s/ban", "s/pii"]}]}}
    message = error_of(data)
    assert "processor instance 'ban' is already at agents.a.inputProcessors.0" in message
    assert "(workflow checks, step 0)" in message


def test_a_nested_workflows_processors_count_in_the_lane_too() -> None:
    data = base(inputProcessors=["s/ban", "workflow:outer"])
    data["workflows"] = {"outer": {"steps": ["workflow:inner"]}, "inner": {"steps": ["s/ban"]}}
    message = error_of(data)
    assert "processor instance 'ban' is already at agents.a.inputProcessors.0" in message
    assert "(workflow outer, step 0) (workflow inner, step 0)" in message


def test_workflows_nesting_in_a_cycle_are_refused_naming_the_path() -> None:
    data = base(inputProcessors=["workflow:a"])
    data["workflows"] = {
        "a": {"steps": ["s/ban", {"workflow": "b"}]},
        "b": {"steps": ["workflow:c"]},
        "c": {"steps": ["workflow:a"]},
    }
    assert "a -> b -> c -> a nest in a cycle" in error_of(data)
    data["workflows"] = {"a": {"steps": ["workflow:a"]}}
    assert "a -> a nest in a cycle" in error_of(data)


def test_a_step_naming_an_unknown_workflow_is_refused() -> None:
    data = base(inputProcessors=["workflow:a"])
    data["workflows"] = {"a": {"steps": ["workflow:nope"]}}
    assert "workflows.a.steps.0: unknown workflow 'nope'" in error_of(data)


def test_conditions_on_the_call_are_checked_and_decided_on_it() -> None:
    when = check_when([{"key": "tier", "equals": "gold"}, {"retryCount": {"lt": 2}}])
    assert decided_per_call(when)
    assert not decided_per_call(check_when({"tier": "gold"}))
    gold = {"tier": "gold"}
    assert when_holds(when, gold, Call("hi", 0, 1))
    assert not when_holds(when, gold, Call("hi", 0, 2))
    assert not when_holds(when, {"tier": "free"}, Call("hi", 0, 0))
    assert not when_holds(when, gold)  # outside a call, a condition on the call fails
    assert when_holds({"stepNumber": {"equals": 3}}, {}, Call(None, 3, 0))
    assert not when_holds({"message": {"matches": "x"}}, {}, Call(None, 0, 0))  # no user message
    with pytest.raises(ValueError, match=r"stepNumber: \{OP: N\}"):
        check_when({"stepNumber": {"gt": 1}})
    with pytest.raises(ValueError, match=r"retryCount: \{OP: N\}"):
        check_when({"retryCount": {"lt": True}})
    with pytest.raises(ValueError, match="not a regular expression"):
        check_when({"message": {"matches": "("}})
