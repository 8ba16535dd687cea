"""AI SDK v5 / v6 UI tool parts (``tool-<name>``, ``dynamic-tool``) and v6 approval parts in input
messages, read as the reference engine reads them (service/api/messages.py, docs/service.md).

What the reference does was measured on the conformance oracle's @mastra/core 1.71.0
(``AIV5Adapter.fromUIMessage``) with a mock model recording its prompt and a memory store: a
completed part reaches the model as a tool call and its result and is stored as a result; an
``output-error`` part as the call and its error text; an ``output-denied`` part as the call and the
approval's reason; a call without a result (an unanswered client call, an ``input-available``
part) is left out of the prompt, a provider-executed one kept on the open turn only. Through one
in-process `Service` (its real HTTP server, a SQLite store, a
scripted model).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.message_shapes import UI_V5_ASSISTANT
from tests.integration.service.support import http_client

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

KEY = {"Authorization": "Bearer key-bo"}
ASKED = {"role": "user", "content": "weather in Paris?"}
THANKS = {"role": "user", "content": "thanks"}
PARIS = {"city": "Paris"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(Path(tmp_path_factory.mktemp("ui-tools")))},
        "models": {
            "echo": {"provider": "scripted", "responses": [{"text": "noted"}] * 50},
            "caller": {
                "provider": "scripted",
                "responses": [{"toolCalls": [{"name": "weather", "args": PARIS}]}, {"text": "sunny"}],
            },
        },
        "agents": {
            "keeper": {"model": "echo", "errorProcessorDefaults": False, "memory": {"lastMessages": 20}},
            "asker": {"model": "caller", "errorProcessorDefaults": False, "memory": {"lastMessages": 20}},
        },
    }
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=[SecretStr("key-bo=user-bo")])
    async with Service(settings, parse_config(config)) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(service, KEY) as client:
        yield client


def _weather(call_id: str, state: str, **keys: Any) -> dict[str, Any]:
    """A ``tool-weather`` UI part for Paris in `state`, with `keys`."""
    return {"type": "tool-weather", "toolCallId": call_id, "state": state, "input": PARIS, **keys}


def _assistant(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": "a-ui", "role": "assistant", "parts": [{"type": "step-start"}, *parts]}


async def _generate(
    http: httpx.AsyncClient, thread: str, *messages: Any, route: str = "generate"
) -> httpx.Response:
    body = {"messages": [ASKED, *messages, THANKS], "memory": {"thread": thread, "resource": "user-bo"}}
    return await http.post(f"/api/agents/keeper/{route}", json=body)


def _prompt_tools(service: Service) -> list[tuple[str, list[dict[str, Any]]]]:
    """The tool calls and results of the model's last prompt: (role, parts) per message."""
    scripted = service.app.models["echo"]
    assert isinstance(scripted, ScriptedModel)
    prompt = scripted.requests[-1].prompt
    return [
        (m["role"], [{k: p[k] for k in ("type", "toolCallId", "toolName", "input", "output") if k in p}])
        for m in prompt
        for p in m["content"]
        if isinstance(p, dict) and p["type"] in ("tool-call", "tool-result")
    ]


async def _stored_invocations(http: httpx.AsyncClient, thread: str) -> list[dict[str, Any]]:
    return await _stored_invocations_of(http, thread, "keeper")


async def _stored_invocations_of(http: httpx.AsyncClient, thread: str, agent: str) -> list[dict[str, Any]]:
    answer = await http.get(f"/api/memory/threads/{thread}/messages?agentId={agent}")
    assert answer.status_code == 200, answer.text
    return [
        p["toolInvocation"]
        for m in answer.json()["messages"]
        for p in m["content"]["parts"]
        if p["type"] == "tool-invocation"
    ]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "tool-weather", "output": {"tempC": 21}},
        {"type": "tool-weather", "output": {"type": "json", "value": {"tempC": 21}}, "preliminary": False},
        {"type": "dynamic-tool", "toolName": "weather", "output": {"tempC": 21}, "title": "Weather"},
    ],
    ids=["static", "wrapped-output", "dynamic"],
)
@pytest.mark.parametrize("route", ["generate", "stream"])
async def test_a_completed_tool_part_reaches_the_prompt_as_a_call_and_result_and_is_stored(
    http: httpx.AsyncClient, service: Service, part: dict[str, Any], route: str
) -> None:
    thread = f"t-done-{route}-{part['type']}-{len(part)}"
    done = {**part, "toolCallId": "c1", "state": "output-available", "input": PARIS}
    said = {"type": "text", "text": "21 degrees"}
    answer = await _generate(http, thread, _assistant(done, said), route=route)
    assert answer.status_code == 200, answer.text
    if route == "generate":
        assert answer.json()["warnings"] == []  # title, preliminary: kept, not data to apply
    call = {"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "input": PARIS}
    result = {"type": "tool-result", "toolCallId": "c1", "toolName": "weather", "output": {"tempC": 21}}
    assert _prompt_tools(service) == [("assistant", [call]), ("tool", [result])]
    assert await _stored_invocations(http, thread) == [
        {"state": "result", "toolCallId": "c1", "toolName": "weather", "args": PARIS, "result": {"tempC": 21}}
    ]


async def test_an_output_error_part_reaches_the_prompt_as_the_call_and_its_error_text(
    http: httpx.AsyncClient, service: Service
) -> None:
    failed = _weather("c2", "output-error", errorText="the weather service is down")
    answer = await _generate(http, "t-error", _assistant(failed))
    assert answer.status_code == 200, answer.text
    call = {"type": "tool-call", "toolCallId": "c2", "toolName": "weather", "input": PARIS}
    error = {"type": "tool-result", "toolCallId": "c2", "toolName": "weather"}
    assert _prompt_tools(service) == [
        ("assistant", [call]),
        ("tool", [{**error, "output": "the weather service is down"}]),
    ]
    assert await _stored_invocations(http, "t-error") == [
        {
            "state": "output-error",
            "toolCallId": "c2",
            "toolName": "weather",
            "args": PARIS,
            "errorText": "the weather service is down",
        }
    ]


async def test_an_output_denied_part_tells_the_model_the_approvals_reason(
    http: httpx.AsyncClient, service: Service
) -> None:
    denied = _weather("c3", "output-denied")
    for approval, told in [
        ({"id": "ap1", "approved": False, "reason": "not now"}, "not now"),
        ({"id": "ap2", "approved": False}, "Tool call was not approved by the user"),
    ]:
        answer = await _generate(
            http, f"t-denied-{approval['id']}", _assistant({**denied, "approval": approval})
        )
        assert answer.status_code == 200, answer.text
        result = {"type": "tool-result", "toolCallId": "c3", "toolName": "weather", "output": told}
        assert _prompt_tools(service)[1] == ("tool", [result])


@pytest.mark.parametrize(
    ("part", "named"),
    [
        (
            {"type": "tool-weather", "state": "input-streaming", "input": {"ci": None}},
            "messages.1.parts.1.state: 'input-streaming' is not taken",
        ),
        (
            {"type": "tool-weather", "state": "approval-requested", "input": PARIS, "approval": {"id": "a"}},
            "messages.1.parts.1.state: 'approval-requested' is not taken",
        ),
        (
            {
                "type": "tool-weather",
                "state": "approval-responded",
                "input": PARIS,
                "approval": {"id": "a", "approved": True},
            },
            "messages.1.parts.1.state: 'approval-responded' is not taken",
        ),
        ({"type": "tool-weather", "state": "output-available", "input": PARIS}, "messages.1.parts.1.state"),
        ({"type": "tool-weather", "state": "done", "output": 1}, "messages.1.parts.1.state: must be"),
        ({"type": "tool-weather", "state": "input-available", "args": {}}, "messages.1.parts.1.args"),
    ],
    ids=["streaming", "approval-requested", "approval-responded", "no-output", "bad-state", "v4-key"],
)
@pytest.mark.parametrize("route", ["generate", "stream"])
async def test_a_tool_part_in_a_state_procmesh_cannot_honour_is_a_400_naming_it(
    http: httpx.AsyncClient, part: dict[str, Any], named: str, route: str
) -> None:
    thread = f"t-refused-{route}-{named.split(':')[-1][:20].strip()}-{len(part)}"
    answer = await _generate(http, thread, _assistant({**part, "toolCallId": "c4"}), route=route)
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]
    listed = await http.get(f"/api/memory/threads/{thread}/messages?agentId=keeper")
    assert listed.status_code == 404  # nothing saved


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        (
            [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool-call", "toolCallId": "c5", "toolName": "weather", "input": PARIS},
                        {"type": "tool-approval-request", "approvalId": "ap5", "toolCallId": "c5"},
                    ],
                }
            ],
            "messages.1.content.1: a tool-approval-request part is not taken",
        ),
        (
            [
                {
                    "role": "tool",
                    "content": [{"type": "tool-approval-response", "approvalId": "ap5", "approved": True}],
                }
            ],
            "messages.1.content.0: a tool-approval-response part is not taken",
        ),
    ],
    ids=["request", "response"],
)
async def test_a_v6_approval_part_is_a_400_naming_it_and_the_routes_that_answer_an_approval(
    http: httpx.AsyncClient, messages: list[dict[str, Any]], named: str
) -> None:
    answer = await _generate(http, f"t-approval-{named[11:18]}", *messages)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert named in error
    assert "approve-tool-call / decline-tool-call" in error


async def test_an_input_available_part_is_a_call_that_a_tool_message_settles(
    http: httpx.AsyncClient, service: Service
) -> None:
    # A client tool's continuation as a v5 client builds it: the call, then the tool's result.
    asked = _weather("c6", "input-available", callProviderMetadata={"mastra": {"modelOutput": "mild"}})
    result = {"type": "tool-result", "toolCallId": "c6", "toolName": "weather", "result": {"tempC": 18}}
    answer = await _generate(http, "t-input", _assistant(asked), {"role": "tool", "content": [result]})
    assert answer.status_code == 200, answer.text
    call = {"type": "tool-call", "toolCallId": "c6", "toolName": "weather", "input": PARIS}
    shown = {"type": "tool-result", "toolCallId": "c6", "toolName": "weather", "output": "mild"}
    assert _prompt_tools(service) == [("assistant", [call]), ("tool", [shown])]  # its model output
    assert await _stored_invocations(http, "t-input") == [
        {"state": "result", "toolCallId": "c6", "toolName": "weather", "args": PARIS, "result": {"tempC": 18}}
    ]


async def test_a_v5_assistant_message_with_every_tool_part_key_is_taken(
    http: httpx.AsyncClient, service: Service
) -> None:
    answer = await _generate(http, "t-v5-keys", UI_V5_ASSISTANT)
    assert answer.status_code == 200, answer.text
    assert answer.json()["warnings"] == []  # its keys are read or kept (title, dynamic, preliminary)
    assert [(role, [p["type"] for p in parts]) for role, parts in _prompt_tools(service)] == [
        ("assistant", ["tool-call"]),
        ("assistant", ["tool-call"]),
        ("tool", ["tool-result"]),
        ("tool", ["tool-result"]),
    ]
    stored = await _stored_invocations(http, "t-v5-keys")
    assert [(i["toolName"], i["state"]) for i in stored] == [
        ("weather", "result"),
        ("forecast", "output-error"),
    ]
    assert stored[1]["rawInput"] == '{"city": "Par'  # the reference's stored part keeps it too


# -- calls without a result --------------------------------------------------------------------
# The reference (``sanitizeV5UIMessages`` in agent/message-list/conversion/output-converter.ts, as
# MessageList builds the prompt) keeps a tool call only with its result or error: a provider
# rejects a call with no result after it. An unresolved provider-executed call stays on the open
# turn only (the last assistant message, no user turn after it).

V4_CALL = {
    "type": "tool-invocation",
    "toolInvocation": {"state": "call", "toolCallId": "c7", "toolName": "weather", "args": PARIS},
}
SAID = {"type": "text", "text": "Let me check."}


def _prompt(service: Service) -> list[dict[str, Any]]:
    """The model's last prompt, without its system messages."""
    scripted = service.app.models["echo"]
    assert isinstance(scripted, ScriptedModel)
    return [m for m in scripted.requests[-1].prompt if m["role"] != "system"]


@pytest.mark.parametrize("part", [V4_CALL, _weather("c7", "input-available")], ids=["v4-call", "v5"])
@pytest.mark.parametrize("route", ["generate", "stream"])
async def test_an_unanswered_call_in_the_history_is_left_out_of_the_prompt(
    http: httpx.AsyncClient, service: Service, part: dict[str, Any], route: str
) -> None:
    thread = f"t-open-{route}-{part['type']}"
    answer = await _generate(http, thread, {**_assistant(SAID, part), "id": thread}, route=route)
    assert answer.status_code == 200, answer.text
    assert _prompt_tools(service) == []  # before: a tool-call c7 with no result after it
    assert [(m["role"], m["content"][0]["text"]) for m in _prompt(service)] == [
        ("user", "weather in Paris?"),
        ("assistant", "Let me check."),  # the message's text stays
        ("user", "thanks"),
    ]


async def test_a_client_tools_call_kept_in_memory_and_never_answered_is_left_out_of_the_next_prompt(
    http: httpx.AsyncClient, service: Service
) -> None:
    # A turn that ends for a client tool keeps its call in the thread (the client's next call
    # would settle it); a next call that sends a new question instead leaves it unanswered.
    memory = {"thread": "t-client-open", "resource": "user-bo"}
    tools = {"weather": {"description": "Weather", "inputSchema": {"type": "object"}}}
    first = await http.post(
        "/api/agents/asker/generate", json={"messages": ["weather?"], "memory": memory, "clientTools": tools}
    )
    assert first.json()["finishReason"] == "tool-calls", first.text
    assert [i["state"] for i in await _stored_invocations_of(http, "t-client-open", "asker")] == ["call"]
    answer = await http.post(
        "/api/agents/asker/generate", json={"messages": ["never mind"], "memory": memory}
    )
    assert answer.status_code == 200, answer.text
    scripted = service.app.models["caller"]
    assert isinstance(scripted, ScriptedModel)
    prompt = [m for m in scripted.requests[-1].prompt if m["role"] != "system"]
    assert prompt == [  # before: the stored call as a tool-call with no result after it
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "user", "content": [{"type": "text", "text": "never mind"}]},
    ]


async def test_an_assistant_message_holding_only_an_unanswered_call_is_left_out_whole(
    http: httpx.AsyncClient, service: Service
) -> None:
    answer = await _generate(http, "t-only-call", _assistant(_weather("c8", "input-available")))
    assert answer.status_code == 200, answer.text
    assert _prompt(service) == [
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]


async def test_the_answered_calls_of_a_message_stay_beside_an_unanswered_one(
    http: httpx.AsyncClient, service: Service
) -> None:
    done = _weather("c9", "output-available", output={"tempC": 21})
    answer = await _generate(http, "t-mixed", _assistant(done, _weather("c10", "input-available")))
    assert answer.status_code == 200, answer.text
    assert [(role, [p["type"] for p in parts]) for role, parts in _prompt_tools(service)] == [
        ("assistant", ["tool-call"]),
        ("tool", ["tool-result"]),
    ]


@pytest.mark.parametrize(("after", "kept"), [([], ["p1"]), ([THANKS], [])], ids=["open-turn", "user-after"])
async def test_an_unanswered_provider_executed_call_stays_on_the_open_turn_only(
    http: httpx.AsyncClient, service: Service, after: list[dict[str, Any]], kept: list[str]
) -> None:
    # A provider may defer its own call (a web search) to its next request: the reference keeps
    # the call while its assistant turn is the last one, and leaves it out once a user turn follows.
    searching = _weather("p1", "input-available", providerExecuted=True)
    thread = f"t-provider-{len(after)}"
    body = {
        "messages": [ASKED, {**_assistant(SAID, searching), "id": thread}, *after],
        "memory": {"thread": thread, "resource": "user-bo"},
    }
    answer = await http.post("/api/agents/keeper/generate", json=body)
    assert answer.status_code == 200, answer.text
    calls = [p for m in _prompt(service) for p in m["content"] if p["type"] == "tool-call"]
    assert [p["toolCallId"] for p in calls] == kept
    assert all(p.get("providerExecuted") is True for p in calls)
