"""Keys inside input messages and their parts: none is ignored silently (service/api/message_keys).

Through one in-process `Service` (its real HTTP server, a SQLite store, scripted models): a key a
message shape does not take is a 400 naming its path, on generate, stream and the memory save, and
nothing reaches memory; every key the shapes' senders write (the AI SDK's model and UI messages,
Mastra's stored messages, what @mastra/client-js sends after a client tool) is taken, the ones
procmesh does not apply named in the result's warnings and counted by
``procmesh_message_keys_ignored_total{key}``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.service.api import message_keys as mk
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.message_shapes import (
    CLIENT_JS_CALL,
    CLIENT_JS_RESULT,
    DATA_URL,
    MODEL_USER,
    OPTIONS,
    STORED,
    STORED_ASSISTANT,
    TOOL_CALL,
    UI_ASSISTANT,
    UI_USER,
    UI_V5_ASSISTANT,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

ADA = {"Authorization": "Bearer key-ada"}
CALL = {"toolCalls": [{"name": "weather", "args": {"city": "Paris"}}]}


class Shout(Processor):
    """Upper-cases the user's text (what `execute` runs the messages through)."""

    id = "shout"

    async def process_input(self, messages: list[Any]) -> list[Any]:
        for message in messages:
            for part in message["content"]["parts"]:
                if part["type"] == "text":
                    part["text"] = part["text"].upper()
        return messages


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    data_dir = Path(tmp_path_factory.mktemp("message-keys"))
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(data_dir)},
        "models": {
            "answer": {"provider": "scripted", "responses": [{"text": "ok then"}] * 200},
            "caller": {"provider": "scripted", "responses": [CALL, {"text": "sunny it is"}] * 50},
        },
        "agents": {
            "keeper": {"model": "answer", "errorProcessorDefaults": False, "memory": {"lastMessages": 20}},
            "caller": {"model": "caller", "errorProcessorDefaults": False},
        },
    }
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=[SecretStr("key-ada=user-ada")])
    async with ProcessorServer([Shout()], ["127.0.0.1:0"]) as sidecar:
        config["sidecars"] = {"p": {"address": sidecar.addresses[0]}}
        async with Service(settings, parse_config(config)) as svc:
            yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    base = f"http://127.0.0.1:{service.http_port}"
    async with httpx.AsyncClient(base_url=base, headers=ADA, timeout=20) as client:
        yield client


async def _thread_messages(http: httpx.AsyncClient, thread: str) -> httpx.Response:
    return await http.get(f"/api/memory/threads/{thread}/messages?agentId=keeper")


def _tool_outputs(service: Service) -> list[Any]:
    """What the caller agent's model saw of the tool results in its last request."""
    scripted = service.app.models["caller"]
    assert isinstance(scripted, ScriptedModel)
    prompt = scripted.requests[-1].prompt
    return [p.get("output") for m in prompt if m["role"] == "tool" for p in m["content"]]


def _counted(text: str) -> dict[str, float]:
    found = re.findall(r'^procmesh_message_keys_ignored_total\{key="([^"]+)"\} (\S+)$', text, re.M)
    return {key: float(value) for key, value in found}


# -- an unknown key is a 400 naming its path, and nothing is saved ------------------------------

UNKNOWN = [
    ({"role": "user", "content": "hi", "name": "ada"}, "messages.0.name: unknown key"),
    ({"role": "user", "content": [{"type": "text", "text": "hi", "cache": 1}]}, "messages.0.content.0.cache"),
    (
        {"role": "user", "content": [{"type": "image", "image": DATA_URL, "detail": "high"}]},
        "messages.0.content.0.detail",
    ),
    (
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}], "colour": 1},
        "messages.0.colour",
    ),
    ({"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi", "x": 1}]}, "messages.0.parts.0.x"),
    (
        {"id": "u1", "role": "user", "parts": [], "experimental_attachments": [{"url": DATA_URL, "size": 3}]},
        "messages.0.experimental_attachments.0.size",
    ),
    (
        {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}], "extra": {}}},
        "messages.0.content.extra",
    ),
    (
        {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "hi", "lang": "en"}]}},
        "messages.0.content.parts.0.lang",
    ),
]


@pytest.mark.parametrize(("message", "named"), UNKNOWN)
@pytest.mark.parametrize("route", ["generate", "stream"])
async def test_an_unknown_key_in_a_message_or_part_is_a_400_naming_it_and_nothing_is_saved(
    http: httpx.AsyncClient, route: str, message: dict[str, Any], named: str
) -> None:
    thread = f"t-unknown-{route}-{UNKNOWN.index((message, named))}"
    body = {"messages": [message], "memory": {"thread": thread, "resource": "user-ada"}}
    answer = await http.post(f"/api/agents/keeper/{route}", json=body)
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]
    assert (await _thread_messages(http, thread)).status_code == 404  # no thread, no message


async def test_a_client_tool_continuation_refuses_unknown_keys_in_its_tool_parts(
    http: httpx.AsyncClient,
) -> None:
    result = {"type": "tool-result", "toolCallId": "c1", "toolName": "weather", "result": 1, "cached": True}
    invocation = {"state": "call", "toolCallId": "c1", "toolName": "weather", "args": {}, "retries": 0}
    for messages, named in [
        ([{"role": "assistant", "content": [{**TOOL_CALL, "id": "x"}]}], "messages.0.content.0.id"),
        ([{"role": "tool", "content": [result]}], "messages.0.content.0.cached"),
        (
            [
                {
                    "id": "a1",
                    "role": "assistant",
                    "parts": [{"type": "tool-invocation", "toolInvocation": invocation}],
                }
            ],
            "messages.0.parts.0.toolInvocation.retries",
        ),
    ]:
        answer = await http.post("/api/agents/caller/generate", json={"messages": ["weather?", *messages]})
        assert answer.status_code == 400, answer.text
        assert named.replace("messages.0", "messages.1") in answer.json()["error"]


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ({"role": "user", "content": "hi", "sender": "ada"}, "messages.0.sender"),
        (
            {"role": "user", "content": [{"type": "text", "text": "hi", "lang": "en"}]},
            "messages.0.content.0.lang",
        ),
        (
            {"role": "user", "content": {"format": 2, "parts": [], "content": "hi", "v": 3}},
            "messages.0.content.v",
        ),
    ],
)
async def test_a_memory_save_with_an_unknown_message_key_is_a_400_and_saves_nothing(
    http: httpx.AsyncClient, message: dict[str, Any], named: str
) -> None:
    thread = f"t-save-{named.replace('.', '-')}"
    good = {"id": "m-good", "role": "user", "content": "kept?", "threadId": thread}
    body = {"messages": [good, {**message, "id": "m-bad", "threadId": thread}]}
    answer = await http.post("/api/memory/save-messages?agentId=keeper", json=body)
    assert answer.status_code == 400, answer.text
    assert named.replace("messages.0", "messages.1") in answer.json()["error"]
    assert (await _thread_messages(http, thread)).status_code == 404  # not even the good one


async def test_a_processor_execute_refuses_an_unknown_message_key_and_counts_an_unapplied_one(
    http: httpx.AsyncClient,
) -> None:
    text = {"type": "text", "text": "hi", "providerOptions": {"openai": {}}}
    for message, status in [
        ({"role": "user", "content": [text], "nick": "ada"}, 400),
        ({"role": "user", "content": [text]}, 200),
    ]:
        before = _counted((await http.get("/metrics")).text).get("textPart.providerOptions", 0)
        answer = await http.post(
            "/api/processors/shout/execute", json={"phase": "input", "messages": [message]}
        )
        assert answer.status_code == status, answer.text
        after = _counted((await http.get("/metrics")).text).get("textPart.providerOptions", 0)
        if status == 400:
            assert "messages.0.nick: unknown key" in answer.json()["error"]
            assert after == before  # refused before anything ran or was counted
        else:
            assert answer.json()["messages"][0]["content"]["parts"] == [{"type": "text", "text": "HI"}]
            assert after == before + 1


# -- every key the senders write is taken -------------------------------------------------------


def _keys_of(*objects: dict[str, Any]) -> set[str]:
    return {key for obj in objects for key in obj}


async def test_the_shapes_sent_hold_every_key_the_tables_take() -> None:
    """The accepted-keys tests below send every key of each shape's table (message_shapes.py): a key
    added to a table and not sent there fails this."""
    model_parts = MODEL_USER["content"]
    stored_parts = STORED["content"]["parts"]
    assistant_parts = STORED_ASSISTANT["content"]["parts"]
    covered = {
        "message": _keys_of(MODEL_USER),
        "uiMessage": _keys_of(UI_USER),
        "dbMessage": _keys_of(STORED),
        "dbContent": _keys_of(STORED["content"]),
        "textPart": _keys_of(model_parts[0]),
        "imagePart": _keys_of(model_parts[1]),
        "filePart": _keys_of(model_parts[2]),
        "uiTextPart": _keys_of(*UI_USER["parts"]),
        "attachment": _keys_of(*UI_USER["experimental_attachments"]),
        "toolCallPart": _keys_of(*CLIENT_JS_CALL["content"]),
        "toolResultPart": _keys_of(*CLIENT_JS_RESULT["content"]),
        "uiToolPart": _keys_of(*UI_ASSISTANT["parts"][1:]),
        "uiToolInvocation": _keys_of(*(p["toolInvocation"] for p in UI_ASSISTANT["parts"][1:])),
        "uiV5ToolPart": _keys_of(*UI_V5_ASSISTANT["parts"][1:]),  # sent by test_ui_tool_parts.py
        "dbStepStart": _keys_of(stored_parts[0]),
        "dbTextPart": _keys_of(stored_parts[1]),
        "dbDataPart": _keys_of(stored_parts[2]),
        "dbFilePart": _keys_of(stored_parts[3]),
        "dbImagePart": _keys_of(stored_parts[4]),
        "dbReasoningPart": _keys_of(assistant_parts[0]),
        "dbToolPart": _keys_of(assistant_parts[1]),
        "dbToolInvocation": _keys_of(assistant_parts[1]["toolInvocation"]),
    }
    tables = [getattr(mk, name) for name in dir(mk) if isinstance(getattr(mk, name), mk.Keys)]
    tables += list(mk.DB_PARTS.values())
    for keys in tables:
        assert {*keys.read, *keys.kept, *keys.counted} <= covered[keys.label], keys.label


async def test_every_key_a_user_message_may_hold_is_taken_and_the_unapplied_ones_are_named(
    http: httpx.AsyncClient, service: Service
) -> None:
    before = _counted((await http.get("/metrics")).text)
    body = {"messages": [STORED, MODEL_USER, UI_USER], "memory": {"thread": "t-all", "resource": "user-ada"}}
    answer = await http.post("/api/agents/keeper/generate", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["text"] == "ok then"
    expected = {
        "messages.message.providerOptions",
        "messages.message.experimental_providerMetadata",
        "messages.textPart.providerOptions",
        "messages.textPart.experimental_providerMetadata",
        "messages.imagePart.providerOptions",
        "messages.imagePart.experimental_providerMetadata",
        "messages.filePart.providerOptions",
        "messages.filePart.experimental_providerMetadata",
        "messages.filePart.providerMetadata",
        "messages.uiMessage.annotations",
        "messages.uiMessage.metadata",
        "messages.uiMessage.data",
        "messages.uiTextPart.providerMetadata",
        "messages.dbContent.experimental_attachments",
    }
    assert {w["setting"] for w in result["warnings"]} == expected
    assert all(w["type"] == "unsupported-setting" and w["details"] for w in result["warnings"])
    after = _counted((await http.get("/metrics")).text)
    for setting in expected:
        key = setting.removeprefix("messages.")
        assert after.get(key, 0) == before.get(key, 0) + 1, key  # once a request, however often
    # the UI message's attachment reached the model as a file part, after its text
    scripted = service.app.models["answer"]
    assert isinstance(scripted, ScriptedModel)
    user_turns = [m for m in scripted.requests[-1].prompt if m["role"] == "user"]
    ui_parts = [p for m in user_turns for p in m["content"]][-2:]
    assert ui_parts[0] == {"type": "text", "text": "and this"}
    assert (ui_parts[1]["type"], ui_parts[1]["mediaType"]) == ("file", "image/png")
    listed = (await _thread_messages(http, "t-all")).json()["messages"]
    assert [m["threadId"] for m in listed[:3]] == ["t-all"] * 3  # the message's own thread replaced


async def test_a_stored_assistant_message_with_every_key_is_taken(http: httpx.AsyncClient) -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        STORED_ASSISTANT,
        {"role": "user", "content": "thanks"},
    ]
    answer = await http.post("/api/agents/keeper/generate", json={"messages": messages})
    assert answer.status_code == 200, answer.text
    assert answer.json()["warnings"] == []  # a stored message's keys are kept with it


async def test_client_js_continuations_after_a_client_tool_are_taken(
    http: httpx.AsyncClient, service: Service
) -> None:
    tools = {"weather": {"description": "Weather", "inputSchema": {"type": "object"}}}
    first = await http.post(
        "/api/agents/caller/generate", json={"messages": "weather?", "clientTools": tools}
    )
    assert first.json()["finishReason"] == "tool-calls", first.text
    call_id = first.json()["toolCalls"][0]["payload"]["toolCallId"]
    sent_back = first.json()["response"]["messages"]  # what executeToolCallAndRespond resends
    result = {**CLIENT_JS_RESULT["content"][0], "toolCallId": call_id}
    body = {"messages": ["weather?", *sent_back, {"role": "tool", "content": [result]}], "clientTools": tools}
    answer = await http.post("/api/agents/caller/generate", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == "sunny it is"
    assert {w["setting"] for w in answer.json()["warnings"]} == {
        f"messages.toolResultPart.{key}"
        for key in (
            "experimental_providerMetadata",
            "isError",
            "experimental_content",
            "__mastraObservability",
        )
    }
    # the client tool's toModelOutput (providerOptions.mastra.modelOutput) is what the model saw
    assert _tool_outputs(service) == [{"type": "text", "value": "clear"}]
    # provider options beside it are not applied: named and counted
    first = await http.post(
        "/api/agents/caller/generate", json={"messages": "weather?", "clientTools": tools}
    )
    call_id = first.json()["toolCalls"][0]["payload"]["toolCallId"]
    options = {"mastra": {"modelOutput": {"type": "text", "value": "dry"}}, "openai": {"cache": True}}
    result = {"type": "tool-result", "toolCallId": call_id, "toolName": "weather", "result": 2}
    resent = [
        *first.json()["response"]["messages"],
        {"role": "tool", "content": [{**result, "providerOptions": options}]},
    ]
    answer = await http.post(
        "/api/agents/caller/generate", json={"messages": ["weather?", *resent], "clientTools": tools}
    )
    assert [w["setting"] for w in answer.json()["warnings"]] == ["messages.toolResultPart.providerOptions"]
    assert _tool_outputs(service) == [{"type": "text", "value": "dry"}]
    result = {**CLIENT_JS_RESULT["content"][0], "toolCallId": call_id}
    # the stream route's continuation without a thread: the UI message the client built
    ui = {**UI_ASSISTANT, "parts": [*UI_ASSISTANT["parts"]]}
    ui["parts"][1] = {
        **ui["parts"][1],
        "toolInvocation": {**ui["parts"][1]["toolInvocation"], "toolCallId": "c9"},
    }
    resent = [
        {"role": "user", "content": "weather?"},
        ui,
        {"role": "tool", "content": [{**result, "toolCallId": "c9"}]},
    ]
    answer = await http.post("/api/agents/caller/generate", json={"messages": resent, "clientTools": tools})
    assert answer.status_code == 200, answer.text
    assert "messages.uiToolInvocation.observability" in {w["setting"] for w in answer.json()["warnings"]}
    model_call = {
        **CLIENT_JS_CALL,
        "content": [CLIENT_JS_CALL["content"][0], {**CLIENT_JS_CALL["content"][1], "toolCallId": "c8"}],
    }
    resent = ["weather?", model_call, {"role": "tool", "content": [{**result, "toolCallId": "c8"}]}]
    answer = await http.post("/api/agents/caller/generate", json={"messages": resent, "clientTools": tools})
    assert answer.status_code == 200, answer.text
    assert "messages.toolCallPart.providerOptions" in {w["setting"] for w in answer.json()["warnings"]}


async def test_a_memory_save_takes_every_key_of_its_message_shapes(http: httpx.AsyncClient) -> None:
    v1 = {"id": "m-v1", "role": "user", "content": "by hand", "threadId": "t-keys", "type": "text"}
    v1 |= {"createdAt": "2026-01-01T00:00:00.000Z", "toolCallIds": [], "toolCallArgs": [], "toolNames": []}
    parts = [{"type": "text", "text": "parts", "providerOptions": OPTIONS}]
    listed = {
        "id": "m-parts",
        "role": "user",
        "content": parts,
        "threadId": "t-keys",
        "resourceId": "user-ada",
    }
    stored = {**STORED, "threadId": "t-keys", "resourceId": "user-ada"}
    answer = await http.post(
        "/api/memory/save-messages?agentId=keeper", json={"messages": [v1, listed, stored]}
    )
    assert answer.status_code == 200, answer.text
    kept = (await _thread_messages(http, "t-keys")).json()["messages"]
    assert [m["id"] for m in kept] == ["m-v1", "m-parts", "m-stored"]
    assert kept[0]["createdAt"] == "2026-01-01T00:00:00.000Z"  # a save keeps the caller's time
    assert kept[2]["content"]["metadata"] == {"k": 1}  # a stored message is kept as given
    assert _counted((await http.get("/metrics")).text).get("textPart.providerOptions", 0) >= 1


async def test_a_tool_results_is_error_is_counted_and_reaches_the_model_and_memory_as_in_the_reference(
    http: httpx.AsyncClient, service: Service
) -> None:
    # The reference engine (@mastra/core 1.71, the conformance oracle) sends a result marked
    # isError to the model as a plain result, {type: "text"}, whichever shape brought it; procmesh
    # does the same, and names the key as not applied, with that reason (docs/service.md).
    failed = {"type": "tool-result", "toolName": "weather", "result": "no such city", "isError": True}
    ui_failed = {
        "id": "a-err",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-invocation",
                "toolInvocation": {**failed, "state": "result", "toolCallId": "c-e2", "args": {}},
            }
        ],
    }
    del ui_failed["parts"][0]["toolInvocation"]["type"]
    messages = [
        {"role": "user", "content": "weather in Atlantis?"},
        {"role": "assistant", "content": [{**TOOL_CALL, "toolCallId": "c-e1"}]},
        {"role": "tool", "content": [{**failed, "toolCallId": "c-e1"}]},
        {"role": "user", "content": "and in Lemuria?"},
        ui_failed,
        {"role": "user", "content": "never mind"},
    ]
    body = {"messages": messages, "memory": {"thread": "t-is-error", "resource": "user-ada"}}
    answer = await http.post("/api/agents/keeper/generate", json=body)
    assert answer.status_code == 200, answer.text
    reason = mk.TOOL_RESULT.reason("isError")
    assert "the reference engine drops it too" in reason
    assert answer.json()["warnings"] == [
        {"type": "unsupported-setting", "setting": f"messages.{label}.isError", "details": reason}
        for label in ("toolResultPart", "uiToolInvocation")
    ]
    scripted = service.app.models["answer"]
    assert isinstance(scripted, ScriptedModel)
    prompt = scripted.requests[-1].prompt
    results = [p for m in prompt if m["role"] == "tool" for p in m["content"]]
    assert [(p["toolCallId"], p["output"]) for p in results] == [
        ("c-e1", "no such city"),
        ("c-e2", "no such city"),
    ]
    assert not any("isError" in p for p in results), results  # a plain result, as the reference's
    stored = (await _thread_messages(http, "t-is-error")).json()["messages"]
    invocations = [
        p["toolInvocation"] for m in stored for p in m["content"]["parts"] if p["type"] == "tool-invocation"
    ]
    assert [(i["toolCallId"], i["state"], i["result"]) for i in invocations] == [
        ("c-e1", "result", "no such city"),
        ("c-e2", "result", "no such city"),
    ]
    assert "isError" not in str(stored)  # the reference stores a v4 CoreMessage's mark nowhere either
