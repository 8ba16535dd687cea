"""tool-search through a real `procmesh-sidecar tool-search` process and the agent loop.

The meta-tools are specs the sidecar adds; the orchestrator cannot execute them
(it runs only the agent's tools), so their calls end as output-error invocations
that the processor completes at the next step (see docs/builtins.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import make_config, prompt_texts, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

LIBRARY = {
    "weather": {
        "description": "Current weather and forecast for a city.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
        "result": {"forecast": "sunny"},
    },
    "stock_price": {"description": "Latest stock price for a ticker symbol.", "result": 42},
    "send_email": {"description": "Send an email message to a recipient.", "result": "sent"},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "tool-search")


def tool_names(request: ModelRequest) -> list[str]:
    return [t["name"] for t in request.tools]


def tool_outputs(request: ModelRequest) -> dict[str, Any]:
    return {p["toolName"]: p["output"] for m in request.prompt if m["role"] == "tool" for p in m["content"]}


async def test_search_load_then_use(address: str) -> None:
    responses = [
        {"toolCalls": [{"name": "search_tools", "args": {"query": "weather forecast"}}]},
        {"toolCalls": [{"name": "load_tool", "args": {"toolName": "weather"}}]},
        {"toolCalls": [{"name": "weather", "args": {"city": "Paris"}}]},
        {"text": "It is sunny."},
    ]
    cfg = make_config(
        address,
        input_processors=[ref("tool-search", include_resolved_tools=True)],
        responses=responses,
        tools=LIBRARY,
    )
    out = await run(cfg, "weather in Paris?", stream=True)
    assert out.result.text == "It is sunny."
    first, second, third, fourth = out.requests
    assert tool_names(first) == ["search_tools", "load_tool"]  # the library is withheld
    assert any("call search_tools with a keyword query" in t for t in prompt_texts(first))
    found = tool_outputs(second)["search_tools"]
    assert found["results"][0]["name"] == "weather"
    assert found["message"].startswith("Found ")
    assert tool_names(second) == ["search_tools", "load_tool"]
    loaded = tool_outputs(third)["load_tool"]
    assert loaded == {
        "success": True,
        "message": 'Tool "weather" loaded successfully. It will be available on your next turn.',
        "toolName": "weather",
        "loaded": ["weather"],
    }
    assert tool_names(third) == ["search_tools", "load_tool", "weather"]
    assert tool_outputs(fourth)["weather"] == {"forecast": "sunny"}  # executed by the orchestrator
    # the meta-tools ran on the sidecar (ExecuteTool): results, not errors, in the stream and steps
    assert [c for c in out.chunks if c["type"] == "tool-error"] == []
    results = [c["payload"]["toolName"] for c in out.chunks if c["type"] == "tool-result"]
    assert results == ["search_tools", "load_tool", "weather"]
    assert out.result.steps[1]["toolResults"][0]["result"] == loaded


async def test_auto_load_and_injected_catalog(address: str) -> None:
    responses = [
        {"toolCalls": [{"name": "search_tools", "args": {"query": "stock"}}]},
        {"text": "done"},
    ]
    cfg = make_config(
        address,
        input_processors=[
            ref("tool-search", include_resolved_tools=True, inject_catalog=True, search={"auto_load": True})
        ],
        responses=responses,
        tools=LIBRARY,
    )
    out = await run(cfg, "price?")
    first, second = out.requests
    assert tool_names(first) == ["search_tools"]  # no load_tool in auto-load mode
    catalog = next(t for t in prompt_texts(first) if "Available tools:" in t)
    assert "- `stock_price`: Latest stock price for a ticker symbol." in catalog
    result = tool_outputs(second)["search_tools"]
    assert result["activation"]["loaded"] == ["stock_price"]
    assert tool_names(second) == ["search_tools", "stock_price"]


async def test_unknown_tool_gets_suggestions_and_resolved_tools_stay_by_default(address: str) -> None:
    responses = [{"toolCalls": [{"name": "load_tool", "args": {"toolName": "mail"}}]}, {"text": "ok"}]
    catalog = [{"name": "send_email_v2", "description": "Send mail.", "inputSchema": {"type": "object"}}]
    cfg = make_config(
        address,
        input_processors=[ref("tool-search", tools=catalog)],
        responses=responses,
        tools={"weather": LIBRARY["weather"]},
    )
    out = await run(cfg, "mail someone")
    first, second = out.requests
    assert tool_names(first) == ["search_tools", "load_tool", "weather"]  # resolved tools stay visible
    result = tool_outputs(second)["load_tool"]
    assert result == {
        "success": False,
        "message": 'Tool "mail" not found. Did you mean: send_email_v2?',
        "toolName": "mail",
    }


@pytest.mark.parametrize(
    ("options", "unexpected"),
    [
        ({"search": {"topK": 2}}, "'topK' was unexpected"),  # the reference's name: here top_k
        ({"tools": [{"name": "weather", "descripton": "Current weather."}]}, "'descripton' was unexpected"),
    ],
)
async def test_a_nested_key_it_does_not_take_is_refused_at_start_up_naming_it(
    address: str, options: dict[str, Any], unexpected: str
) -> None:
    """A key of `search` or of a catalog tool the options do not have was ignored: `topK` left
    top_k at 5, a misspelt description left the tool undescribed. Start-up now fails naming it."""
    with pytest.raises(ConfigError, match="tool-search") as info:
        await run(make_config(address, input_processors=[ref("tool-search", **options)]))
    assert unexpected in str(info.value)
