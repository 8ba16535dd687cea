"""What a step sends the model, through a real tool sidecar: tool definitions under
``toolChoice: 'none'`` with and without a structured-output schema (SEED-GAPS B16).
"""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator import StructuredOutput
from procmesh_orchestrator.app import App
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions
from tests.e2e.tools.harness import config, offered

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def weather_config(py_tools: str, responses: list[dict[str, Any]], **agent: Any) -> Any:
    return config(
        sidecars={"py": {"address": py_tools, "timeout": 5}},
        tools={"weather": {"sidecar": "py"}},
        responses=responses,
        **agent,
    )


def requests(app: App) -> list[Any]:
    model = app.models["m"]
    assert isinstance(model, ScriptedModel)
    return model.requests


async def test_tool_choice_none_drops_the_tool_definitions_only_with_a_schema(py_tools: str) -> None:
    cfg = weather_config(py_tools, [{"text": '{"city": "Paris"}'}, {"text": "No tools today."}])
    async with App(cfg) as app:
        agent = app.agent("a")
        answered = await agent.generate(
            "Weather?", CallOptions(tool_choice="none", structured_output=StructuredOutput(SCHEMA))
        )
        plain = await agent.generate("Weather?", CallOptions(tool_choice="none"))
        with_schema, without = requests(app)
        tools_sent = offered(app, 1)
    assert answered.object == {"city": "Paris"}
    assert plain.text == "No tools today."
    # the step asked for the JSON value alone: no definitions, and so no tool choice either
    assert with_schema.tools == []
    assert with_schema.tool_choice is None
    assert with_schema.response_format is not None
    # 'none' alone keeps them: the conversation's earlier calls stay meaningful to the model
    assert set(tools_sent) == {"weather"}
    assert without.tool_choice == "none"
