"""The generate / stream body options of @mastra/client-js and the result fields it reads (issue 20).

One in-process `Service` per module over scripted models (each keeps the requests the runs made)
and an in-process sidecar whose processor reports a violation; SSE heartbeats every 50 ms.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh import Processor, ProcessorServer, tracing
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
WEATHER_CALL = {"toolCalls": [{"name": "weather", "args": {"city": "Paris"}}]}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp": {"type": "number"}},
    "required": ["city", "temp"],
}


class Warner(Processor):
    """Reports one violation per input, without aborting (a warn strategy)."""

    id = "warner"

    async def process_input(self, messages: list[Any], report_violation: Any) -> None:
        report_violation("the input is too polite", {"score": 0.5})


def _config(address: str) -> dict[str, Any]:
    def scripted(responses: list[dict[str, Any]], delay: float = 0) -> dict[str, Any]:
        return {"provider": "scripted", "responses": responses * 30, "delayMs": delay}

    plain = {"errorProcessorDefaults": False}
    return {
        "sidecars": {"w": {"address": address}},
        "models": {
            "answer": scripted([{"text": "ok then"}]),
            "tooler": scripted([WEATHER_CALL, {"text": "sunny it is"}]),
            "caller": scripted([WEATHER_CALL, {"text": "sunny it is"}]),
            "json": scripted([{"text": '```json\n{"city": "Paris", "temp": 21}\n```'}]),
            "prose": scripted([{"text": "It is 21 degrees in Paris."}]),
            "slow": scripted([{"text": "one two"}], delay=400),
            "warned": scripted([{"text": "fine"}]),
        },
        "tools": {
            "weather": {
                "description": "Weather",
                "inputSchema": {"type": "object"},
                "result": {"sky": "clear"},
            },
            "news": {"description": "News", "inputSchema": {"type": "object"}, "result": "none"},
        },
        "agents": {
            "plain": {"model": "answer", "instructions": "Agent instructions.", **plain},
            "tools": {"model": "tooler", "tools": ["weather", "news"], **plain},
            "caller": {"model": "caller", "tools": ["weather"], **plain},
            "json": {"model": "json", **plain},
            "prose": {"model": "prose", **plain},
            "slow": {"model": "slow", **plain},
            "warned": {"model": "warned", "inputProcessors": [{"processor": "w/warner"}], **plain},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[Service]:
    async with ProcessorServer([Warner()], ["127.0.0.1:0"]) as sidecar:
        settings = OrchestratorSettings(http_port=0, grpc_port=0, sse_heartbeat_seconds=0.05)
        async with Service(settings, parse_config(_config(sidecar.addresses[0]))) as svc:
            yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as client:
        yield client


def _last_request(service: Service, model: str) -> ModelRequest:
    scripted = service.app.models[model]
    assert isinstance(scripted, ScriptedModel)
    return scripted.requests[-1]


def _systems(request: ModelRequest) -> list[str]:
    return [m["content"] for m in request.prompt if m["role"] == "system"]


async def _generate(http: httpx.AsyncClient, agent: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(f"/api/agents/{agent}/generate", json=body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


# -- options reach the model request ------------------------------------------------------------


async def test_model_settings_reach_every_model_request(http: httpx.AsyncClient, service: Service) -> None:
    settings = {"temperature": 0.2, "maxOutputTokens": 64, "topP": 0.9, "seed": 7, "stopSequences": ["END"]}
    await _generate(http, "tools", {"messages": "weather?", "modelSettings": settings})
    scripted = service.app.models["tooler"]
    assert isinstance(scripted, ScriptedModel)
    assert [r.model_settings for r in scripted.requests[-2:]] == [settings, settings]


async def test_the_references_other_settings_run_with_a_warning_or_apply(
    http: httpx.AsyncClient, service: Service
) -> None:
    settings = {"temperature": 0.2, "maxRetries": 4, "headers": {"x-a": "1"}, "reasoning": "low"}
    body = await _generate(http, "plain", {"messages": "hi", "modelSettings": settings})
    assert body["status"] == "success"
    assert [(w["type"], w["setting"]) for w in body["warnings"]] == [
        ("unsupported-setting", "headers"),
        ("unsupported-setting", "reasoning"),
    ]
    scripted = service.app.models["answer"]
    assert isinstance(scripted, ScriptedModel)
    assert scripted.requests[-1].model_settings == {"temperature": 0.2, "maxRetries": 4}  # applied
    metrics = (await http.get("/metrics")).text
    assert 'procmesh_call_settings_ignored_total{setting="headers"} 1.0' in metrics
    assert 'procmesh_call_settings_ignored_total{setting="timeout"}' not in metrics
    plain = await _generate(http, "plain", {"messages": "hi", "modelSettings": {"maxRetries": 0}})
    assert plain["warnings"] == []


async def test_model_and_provider_options_apply_to_every_step(
    http: httpx.AsyncClient, service: Service
) -> None:
    # they were accepted and ignored: the run used the agent's model
    options = {"openai": {"user": "u1"}}
    body = await _generate(http, "plain", {"messages": "hi", "model": "prose", "providerOptions": options})
    assert (body["text"], body["warnings"]) == ("It is 21 degrees in Paris.", [])
    assert _last_request(service, "prose").provider_options == options


async def test_options_procmesh_does_not_apply_run_with_a_warning(http: httpx.AsyncClient) -> None:
    extra = {"tracingOptions": {"metadata": {}}, "toolCallConcurency": 2}
    body = await _generate(http, "plain", {"messages": "hi", **extra})
    assert body["status"] == "success"
    assert [(w["setting"], w["details"]) for w in body["warnings"]] == [
        ("toolCallConcurency", "neither procmesh nor the reference server takes this option"),
        ("tracingOptions", "procmesh continues the caller's W3C traceparent header instead"),
    ]
    metrics = (await http.get("/metrics")).text
    assert 'procmesh_call_settings_ignored_total{setting="tracingOptions"} 1.0' in metrics
    assert 'procmesh_call_settings_ignored_total{setting="other"} 1.0' in metrics  # never the key
    response = await http.post(
        "/api/agents/json/generate", json={"messages": "x", "output": {"type": "object"}}
    )
    assert (response.status_code, response.json()["error"]) == (
        400,
        "output: give the schema as structuredOutput: {schema}",
    )


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"temprature": 1}, "modelSettings.temprature"),
        ({"maxRetries": -1}, "modelSettings.maxRetries"),
        ({"timeout": {"totalMillis": 5}}, "modelSettings.timeout.totalMillis"),
        ({"headers": ["x"]}, "modelSettings.headers"),
    ],
)
async def test_a_malformed_model_setting_is_a_400_naming_it(
    http: httpx.AsyncClient, settings: dict[str, Any], named: str
) -> None:
    response = await http.post(
        "/api/agents/plain/generate", json={"messages": "hi", "modelSettings": settings}
    )
    assert response.status_code == 400
    assert named in response.json()["error"]


async def test_an_unknown_model_setting_is_a_400_naming_it(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/api/agents/plain/generate", json={"messages": "hi", "modelSettings": {"temprature": 1}}
    )
    assert response.status_code == 400
    assert "modelSettings.temprature" in response.json()["error"]


async def test_a_prepare_step_is_a_400_not_dropped(http: httpx.AsyncClient) -> None:
    # the reference's prepareStep is a function: whatever JSON arrives under its name is not one
    response = await http.post("/api/agents/plain/generate", json={"messages": "hi", "prepareStep": {}})
    assert response.status_code == 400
    assert response.json()["error"].startswith("prepareStep is a function and cannot cross HTTP")


async def test_a_thread_and_memory_options_for_an_agent_without_memory_run_with_a_warning(
    http: httpx.AsyncClient,
) -> None:
    """`plain` has no memory: the turn is neither loaded nor saved, and the caller is told so (the
    reference logs that they "will not work"); a resource alone is no memory option."""
    memory = {"thread": "t1", "resource": "ada", "options": {"lastMessages": 3}}
    body = await _generate(http, "plain", {"messages": "hi", "memory": memory})
    assert body["status"] == "success"
    assert [(w["setting"], w["details"]) for w in body["warnings"]] == [
        (
            "memory.thread",
            "the agent has no memory: the thread is neither loaded nor saved (hooks see its id)",
        ),
        ("memory.options", "the agent has no memory: the call's memory options apply to nothing"),
    ]
    shorthand = {"messages": "hi", "threadId": "t1", "resourceId": "ada", "memory": {"readOnly": True}}
    assert [w["setting"] for w in (await _generate(http, "plain", shorthand))["warnings"]] == [
        "memory.thread",
        "memory.options",
    ]
    assert (await _generate(http, "plain", {"messages": "hi", "resourceId": "ada"}))["warnings"] == []
    metrics = (await http.get("/metrics")).text
    assert 'procmesh_call_settings_ignored_total{setting="memory.thread"} 2.0' in metrics
    assert 'procmesh_call_settings_ignored_total{setting="memory.options"} 2.0' in metrics


@pytest.mark.parametrize(
    "body",
    [{"threadId": "t1"}, {"memory": {"thread": "t1"}}, {"memory": {"thread": {"id": "t1"}}}],
    ids=["threadId", "memory.thread", "memory.thread.id"],
)
async def test_a_thread_without_a_resource_is_a_400_naming_resource_id(
    http: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    # the run could neither load nor save the thread: it used to run without memory, silently
    for route in ("generate", "stream"):
        response = await http.post(f"/api/agents/plain/{route}", json={"messages": "hi", **body})
        assert response.status_code == 400, response.text
        assert "threadId: a thread belongs to a resource" in response.json()["error"]
        assert "resourceId" in response.json()["error"]


@pytest.mark.parametrize(
    "choice", ["none", "required", {"type": "tool", "toolName": "weather"}], ids=["none", "required", "tool"]
)
async def test_tool_choice_reaches_the_model_request(
    http: httpx.AsyncClient, service: Service, choice: Any
) -> None:
    await _generate(http, "tools", {"messages": "weather?", "toolChoice": choice, "maxSteps": 1})
    assert _last_request(service, "tooler").tool_choice == choice


async def test_a_malformed_tool_choice_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.post("/api/agents/tools/generate", json={"messages": "x", "toolChoice": "always"})
    assert response.status_code == 400
    assert "toolChoice" in response.json()["error"]


async def test_active_tools_limit_the_offered_tools(http: httpx.AsyncClient, service: Service) -> None:
    await _generate(http, "tools", {"messages": "weather?", "activeTools": ["news"], "maxSteps": 1})
    assert [t["name"] for t in _last_request(service, "tooler").tools] == ["news"]
    await _generate(http, "tools", {"messages": "weather?", "maxSteps": 1})
    assert sorted(t["name"] for t in _last_request(service, "tooler").tools) == ["news", "weather"]


@pytest.mark.parametrize(
    ("instructions", "expected"),
    [
        ("Call instructions.", ["Call instructions."]),
        ({"role": "system", "content": "As a message."}, ["As a message."]),
        (["First.", "Second."], ["First.\n\nSecond."]),
        ("", []),
    ],
    ids=["string", "message", "list", "empty"],
)
async def test_instructions_replace_the_agents(
    http: httpx.AsyncClient, service: Service, instructions: Any, expected: list[str]
) -> None:
    await _generate(http, "plain", {"messages": "hi", "instructions": instructions})
    assert _systems(_last_request(service, "answer")) == expected


async def test_system_adds_to_the_instructions(http: httpx.AsyncClient, service: Service) -> None:
    await _generate(http, "plain", {"messages": "hi", "system": "Answer in French."})
    assert _systems(_last_request(service, "answer")) == ["Agent instructions.", "Answer in French."]
    await _generate(http, "plain", {"messages": "hi"})
    assert _systems(_last_request(service, "answer")) == ["Agent instructions."]


# -- image and file parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "what is it?"}, {"type": "image", "image": PNG}],
            },
            {"type": "file", "mediaType": "image/png", "data": PNG},
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image", "image": "https://x.test/a.jpg", "mimeType": "image/jpeg"}],
            },
            {"type": "file", "mediaType": "image/jpeg", "data": "https://x.test/a.jpg"},
        ),
        (
            {"role": "user", "content": [{"type": "file", "data": "aGk=", "mediaType": "application/pdf"}]},
            {"type": "file", "mediaType": "application/pdf", "data": "aGk="},
        ),
        (
            {
                "role": "user",
                "parts": [{"type": "file", "mediaType": "image/gif", "url": f"data:image/gif;base64,{PNG}"}],
            },
            {"type": "file", "mediaType": "image/gif", "data": f"data:image/gif;base64,{PNG}"},
        ),
        (
            {"role": "user", "parts": [{"type": "file", "mimeType": "text/plain", "data": "aGk="}]},
            {"type": "file", "mediaType": "text/plain", "data": "aGk="},
        ),
        (
            {
                "role": "user",
                "content": {"format": 2, "parts": [{"type": "file", "mimeType": "image/png", "data": PNG}]},
            },
            {"type": "file", "mediaType": "image/png", "data": PNG},
        ),
    ],
    ids=["model-image-base64", "model-image-url", "model-file", "ui-v5-file", "ui-v4-file", "db-message"],
)
async def test_image_and_file_parts_reach_the_prompt(
    http: httpx.AsyncClient, service: Service, message: dict[str, Any], expected: dict[str, Any]
) -> None:
    await _generate(http, "plain", {"messages": [message]})
    (user,) = [m for m in _last_request(service, "answer").prompt if m["role"] == "user"]
    assert expected in user["content"]


async def test_a_file_part_without_a_media_type_is_a_400(http: httpx.AsyncClient) -> None:
    message = {"role": "user", "content": [{"type": "file", "data": "aGk="}]}
    response = await http.post("/api/agents/plain/generate", json={"messages": [message]})
    assert response.status_code == 400
    assert "messages.0.content.0: a file part needs its mediaType" in response.json()["error"]


# -- result fields ---------------------------------------------------------------------------------


async def test_the_result_has_the_references_tool_fields(http: httpx.AsyncClient) -> None:
    body = await _generate(http, "caller", {"messages": "weather?"})
    run_id = body["runId"]
    (call,) = body["toolCalls"]
    assert call["type"] == "tool-call"
    assert call["runId"] == run_id
    assert (call["payload"]["toolName"], call["payload"]["args"]) == ("weather", {"city": "Paris"})
    (result,) = body["toolResults"]
    assert result["type"] == "tool-result"
    assert result["payload"]["toolCallId"] == call["payload"]["toolCallId"]
    assert result["payload"]["result"] == {"sky": "clear"}
    assert body["steps"][0]["toolCalls"] == [call]
    assert body["steps"][1]["toolCalls"] == []
    assert body["totalUsage"] == body["usage"]
    assert body["totalUsage"]["totalTokens"] == 30  # two scripted steps of 10 + 5
    assert body["messages"] == body["response"]["messages"]
    assert [m["role"] for m in body["messages"]] == ["assistant", "assistant"]
    assert body["traceId"] is None  # tracing is off in this process
    assert body["violations"] == []
    assert body["object"] is None


async def test_trace_id_is_the_runs_trace_when_tracing_is_on(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setattr(tracing, "_tracer", TracerProvider().get_tracer("test"))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    response = await http.post("/api/agents/plain/generate", json={"messages": "hi"}, headers=headers)
    assert response.json()["traceId"] == trace_id


async def test_violations_are_in_the_result_and_the_stream(http: httpx.AsyncClient) -> None:
    body = await _generate(http, "warned", {"messages": "please"})
    expected = {"processorId": "warner", "message": "the input is too polite", "detail": {"score": 0.5}}
    assert body["status"] == "success"
    assert body["violations"] == [expected]
    chunks = await stream_chunks(http, "warned", {"messages": "please"})
    (chunk,) = [c for c in chunks if isinstance(c, dict) and c["type"] == "data-procmesh-violation"]
    assert (chunk["data"], chunk["transient"]) == (expected, True)
    kinds = [c["type"] for c in chunks if isinstance(c, dict)]
    assert kinds.index("start") < kinds.index("data-procmesh-violation") < kinds.index("step-start")


# -- structured output --------------------------------------------------------------------------------


async def test_structured_output_parses_and_validates_the_answer(
    http: httpx.AsyncClient, service: Service
) -> None:
    body = await _generate(http, "json", {"messages": "weather?", "structuredOutput": {"schema": SCHEMA}})
    assert (body["status"], body["object"]) == ("success", {"city": "Paris", "temp": 21})
    assert body["usedFallbackValue"] is False
    request = _last_request(service, "json")
    assert request.response_format == {"type": "json", "schema": SCHEMA, "name": "response"}
    assert json.dumps(SCHEMA) in _systems(request)[-1]
    chunks = await stream_chunks(http, "json", {"messages": "w", "structuredOutput": {"schema": SCHEMA}})
    (obj,) = [c for c in chunks if isinstance(c, dict) and c["type"] == "object-result"]
    assert obj["object"] == {"city": "Paris", "temp": 21}


async def test_json_prompt_injection_sends_the_schema_in_the_prompt_alone(
    http: httpx.AsyncClient, service: Service
) -> None:
    so = {"schema": SCHEMA, "jsonPromptInjection": True}
    body = await _generate(http, "json", {"messages": "weather?", "structuredOutput": so})
    assert (body["status"], body["object"]) == ("success", {"city": "Paris", "temp": 21})
    request = _last_request(service, "json")
    assert request.response_format is None  # the reference sends no native format then
    assert json.dumps(SCHEMA) in _systems(request)[-1]
    so["jsonPromptInjection"] = False
    await _generate(http, "json", {"messages": "weather?", "structuredOutput": so})
    native = _last_request(service, "json").response_format
    assert native == {"type": "json", "schema": SCHEMA, "name": "response"}


@pytest.mark.parametrize(
    ("strategy", "status", "obj"),
    [
        ("strict", "failed", None),
        ("warn", "success", None),
        ("fallback", "success", {"city": "?", "temp": 0}),
    ],
)
async def test_a_mismatch_follows_the_error_strategy(
    http: httpx.AsyncClient, strategy: str, status: str, obj: Any
) -> None:
    so = {"schema": SCHEMA, "errorStrategy": strategy, "fallbackValue": {"city": "?", "temp": 0}}
    body = await _generate(http, "prose", {"messages": "weather?", "structuredOutput": so})
    assert (body["status"], body["object"]) == (status, obj)
    assert body["usedFallbackValue"] is (strategy == "fallback")
    # the fallbackValue is used only by the fallback strategy: with another, the call is told so
    ignored = [] if strategy == "fallback" else ["structuredOutput.fallbackValue"]
    assert [w["setting"] for w in body["warnings"]] == ignored
    if strategy == "strict":
        assert body["finishReason"] == "error"
        assert "structured output: the answer is not JSON" in body["error"]


@pytest.mark.parametrize(
    ("so", "error"),
    [
        ({"schema": {"type": "objekt"}}, "structuredOutput.schema: not a valid JSON schema"),
        ({"schema": SCHEMA, "model": {"modelId": "gpt-4o-mini"}}, "structuredOutput.model"),
        ({"schema": SCHEMA, "errorStrategy": "ignore"}, "structuredOutput.errorStrategy"),
        ({"schema": SCHEMA, "jsonPromptInjection": "auto"}, "structuredOutput.jsonPromptInjection"),
        ({"schema": SCHEMA, "useAgent": True}, "structuredOutput.useAgent: Extra inputs"),
    ],
)
async def test_a_bad_structured_output_is_a_400(
    http: httpx.AsyncClient, so: dict[str, Any], error: str
) -> None:
    response = await http.post("/api/agents/json/generate", json={"messages": "x", "structuredOutput": so})
    assert response.status_code == 400
    assert error in response.json()["error"]


# -- heartbeats ---------------------------------------------------------------------------------------


async def test_a_silent_stream_sends_heartbeats_between_chunks(http: httpx.AsyncClient) -> None:
    lines: list[str] = []
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hi"}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line:
                lines.append(line)
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    texts = [i for i, line in enumerate(lines) if line.startswith("data: {") and '"text-delta"' in line]
    assert len(texts) == 2
    # the model waits 400 ms between its two deltas: pings come in between, and nothing is reordered
    assert ": ping" in lines[texts[0] : texts[1]]
    assert [d["payload"]["text"] for d in data if d["type"] == "text-delta"] == ["one", " two"]
    assert lines[-1] == "data: [DONE]"
