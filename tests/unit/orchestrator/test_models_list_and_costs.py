"""An agent's model list and cost-control settings as the config reads them; prices as costs;
what a structuring model is given (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from procmesh_orchestrator.config import Config
from procmesh_orchestrator.config.cost import PriceConfig
from procmesh_orchestrator.run.framework.cost import cost_nanos
from procmesh_orchestrator.run.structured import structuring_input


def _config(agent: dict[str, Any], **top: Any) -> Config:
    return Config.model_validate({"agents": {"a": agent}, **top})


def test_a_model_list_keeps_the_enabled_models_in_order() -> None:
    agent = _config(
        {
            "model": [
                {"model": "demo", "maxRetries": 2},
                {"model": "openai/off", "enabled": False},
                {"model": "openai/on"},
            ]
        }
    ).agents["a"]
    assert agent.model == "demo"
    assert [(m.model, m.max_retries) for m in agent.models] == [("demo", 2), ("openai/on", 0)]
    assert [m.model for m in _config({"model": "demo"}).agents["a"].models] == ["demo"]


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ([], "model: give a model, or a non-empty list of {model, maxRetries, enabled}"),
        ([{"model": "demo", "enabled": False}], "every model of the list is disabled"),
        ([{"model": "demo"}, {"model": "nope"}], "agents.a.model: unknown model 'nope'"),
        ([{"model": "demo", "maxRetries": -1}], "Input should be greater than or equal to 0"),
        ([{"model": "demo", "retries": 1}], "Extra inputs are not permitted"),
    ],
)
def test_a_bad_model_list_names_the_problem(model: Any, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem.replace("{", r"\{").replace("}", r"\}")):
        _config({"model": model})


def test_cost_control_needs_a_price_for_every_listed_model() -> None:
    limit = {"maxCost": 1}
    prices = {"demo": {"input": 1, "output": 2}}
    agent = {"model": [{"model": "demo"}, {"model": "openai/gpt-x"}], "costControl": limit}
    with pytest.raises(ValidationError, match=r"model 'openai/gpt-x' has no price \(add prices.openai/gpt-x"):
        _config(agent, prices=prices)
    ok = _config({**agent, "model": "demo"}, prices=prices).agents["a"].cost_control
    assert ok is not None
    assert (ok.scope, ok.window_seconds, ok.strategy) == ("resource", 7 * 86400, "block")


def test_a_price_per_million_tokens_is_a_cost_in_nano_units() -> None:
    price = PriceConfig(input=0.25, output=2.0)
    assert cost_nanos(price, 1_000_000, 0) == 250_000_000  # 0.25 exactly
    assert cost_nanos(price, 10, 5) == 12_500  # 10 * 0.25e-6 + 5 * 2e-6 = 0.0000125
    assert cost_nanos(PriceConfig(input=0, output=0), 10**9, 10**9) == 0


def test_the_structuring_model_reads_tool_calls_results_and_the_answer() -> None:
    steps = [
        {
            "toolCalls": [{"toolName": "weather", "args": {"city": "Paris"}}],
            "toolResults": [{"toolName": "weather", "result": {"celsius": 21}}],
        }
    ]
    assert structuring_input(steps, "Sunny.") == (
        '# Tool Calls\n## weather\n### Input: {"city": "Paris"}\n### Output: \n\n'
        '# Tool Results\nweather: {\n  "celsius": 21\n}\n\n'
        "# Assistant Response\nSunny."
    )
    assert structuring_input([], "") == ""
