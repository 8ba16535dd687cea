"""A model setting the model's API has no field for (OpenAI ``topK``, Anthropic ``seed``) is left
out of the request body, and said so, as the reference reports it (a call warning
``{type: "unsupported-setting", setting}``): in the step's ``warnings``, the result's, the stream's
``step-start`` and ``procmesh_call_settings_ignored_total{setting}`` with a WARNING line, however the
run ends (failed, or suspended and then approved to its end). Fake OpenAI and Anthropic APIs on
real sockets, the in-process service over real HTTP and gRPC."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from google.protobuf import json_format

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.providers.fakes import FakeAnthropic, FakeOpenAI, error
from tests.integration.service.support import agent_stub, settings_ignored, sse_events, stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {"temperature": 0.2, "topK": 5, "seed": 7}


@pytest.fixture(scope="module")
def apis() -> Iterator[tuple[FakeOpenAI, FakeAnthropic]]:
    openai, anthropic = FakeOpenAI(), FakeAnthropic()
    openai.start()
    anthropic.start()
    openai.script("gpt", *[{"text": "Hi."}] * 4)
    openai.script("retried", {"text": "Hi."})
    weather = {"toolCalls": [{"id": "c1", "name": "weather", "args": {"city": "Paris"}}]}
    for model in ("fail-http", "fail-grpc"):  # a step, then a model call the API refuses
        openai.script(model, weather, error(400, "no such thing"))
    asking = ("ask-approve", "ask-decline", "ask-stream", "ask-grpc-approve", "ask-grpc-decline")
    for model in asking:  # the call awaits a decision, then answers
        openai.script(model, weather, {"text": "Sunny."})
    anthropic.script("claude", *[{"text": "Hi."}] * 4)
    yield openai, anthropic
    openai.stop()
    anthropic.stop()


def _config(openai: FakeOpenAI, anthropic: FakeAnthropic, db: Path) -> dict[str, Any]:
    """Agent ``gpt`` on the fake OpenAI API, ``claude`` on the fake Anthropic one; ``fail-http``,
    ``fail-grpc`` and the ``ask-*`` agents on OpenAI with a ``weather`` tool; ``retried`` on
    OpenAI with its own retries (``model: [{model, maxRetries}]``);
    ``durable-http`` and ``durable-grpc``, durable twins of ``gpt``."""
    kinds = {"oa": ("openai", openai), "an": ("anthropic", anthropic)}
    models = {"gpt": "oa/gpt", "claude": "an/claude"}
    asking = ("ask-approve", "ask-decline", "ask-stream", "ask-grpc-approve", "ask-grpc-decline")
    tooled = {name: f"oa/{name}" for name in ("fail-http", "fail-grpc", *asking)}
    agents: dict[str, Any] = {
        agent: {"model": model, "errorProcessorDefaults": False} for agent, model in models.items()
    }
    agents |= {
        a: {"model": m, "errorProcessorDefaults": False, "tools": ["weather"]} for a, m in tooled.items()
    }
    agents["retried"] = {"model": [{"model": "oa/retried", "maxRetries": 1}], "errorProcessorDefaults": False}
    agents |= {  # durable twins of gpt, one per transport
        f"durable-{t}": {"model": "oa/gpt", "durable": True, "errorProcessorDefaults": False}
        for t in ("http", "grpc")
    }
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "providers": {name: {"kind": kind, "baseUrl": api.base_url} for name, (kind, api) in kinds.items()},
        "tools": {
            "weather": {"description": "Weather", "inputSchema": {"type": "object"}, "result": "sunny"}
        },
        "agents": agents,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(
    apis: tuple[FakeOpenAI, FakeAnthropic], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    db = tmp_path_factory.mktemp("settings") / "memory.db"
    async with Service(settings, parse_config(_config(*apis, db))) as svc:
        yield svc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as client:
        yield client


def _warned(caplog: pytest.LogCaptureFixture, agent: str) -> list[str]:
    """The WARNING lines naming the agent's model settings its model does not take."""
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return [line for line in lines if f"agent {agent!r}: a run's model settings" in line]


@pytest.mark.parametrize(
    ("agent", "unsupported", "sent"),
    [("gpt", "topK", {"temperature": 0.2, "seed": 7}), ("claude", "seed", {"temperature": 0.2, "top_k": 5})],
)
async def test_a_setting_the_models_api_lacks_is_a_warning_of_the_step_and_the_result(
    http: httpx.AsyncClient,
    apis: tuple[FakeOpenAI, FakeAnthropic],
    agent: str,
    unsupported: str,
    sent: dict[str, object],
) -> None:
    api = apis[0] if agent == "gpt" else apis[1]
    before = len(api.calls(agent))
    body = {"messages": "hi", "modelSettings": SETTINGS}
    result = (await http.post(f"/api/agents/{agent}/generate", json=body)).json()
    assert result["status"] == "success", result
    (request,) = api.calls(agent)[before:]
    assert {k: request.body.get(k) for k in sent} == sent  # what the API has is sent
    assert not {"top_k", "topK"} & set(request.body) if agent == "gpt" else "seed" not in request.body
    model_id = "oa/gpt" if agent == "gpt" else "an/claude"
    why = f"{model_id}'s API has no such setting: it was not sent"
    warning = {"type": "unsupported-setting", "setting": unsupported, "details": why}
    assert result["steps"][0]["warnings"] == [warning]
    assert result["warnings"] == [warning]
    metrics = (await http.get("/metrics")).text
    assert f'procmesh_call_settings_ignored_total{{setting="{unsupported}"}} 1.0' in metrics

    chunks = [c for c in await stream_chunks(http, agent, body) if isinstance(c, dict)]
    (start,) = [c for c in chunks if c["type"] == "step-start"]
    assert start["payload"]["warnings"] == [warning]
    metrics = (await http.get("/metrics")).text
    assert f'procmesh_call_settings_ignored_total{{setting="{unsupported}"}} 2.0' in metrics


async def test_a_model_with_its_own_retries_warns_as_the_model_does(
    http: httpx.AsyncClient, apis: tuple[FakeOpenAI, FakeAnthropic]
) -> None:
    """An agent's model given ``maxRetries`` (the retrying wrapper) names what its API lacks too."""
    body = {"messages": "hi", "modelSettings": {"temperature": 0.2, "topK": 5}}
    result = (await http.post("/api/agents/retried/generate", json=body)).json()
    assert result["status"] == "success", result
    (request,) = apis[0].calls("retried")
    assert (request.body.get("temperature"), "top_k" in request.body) == (0.2, False)
    why = "oa/retried's API has no such setting: it was not sent"
    assert result["warnings"] == [{"type": "unsupported-setting", "setting": "topK", "details": why}]


async def test_settings_the_api_has_give_no_warning(http: httpx.AsyncClient) -> None:
    body = {"messages": "hi", "modelSettings": {"temperature": 0.2, "seed": 7}}
    result = (await http.post("/api/agents/gpt/generate", json=body)).json()
    assert result["warnings"] == []
    assert result["steps"][0]["warnings"] == []


async def _generate(
    service: Service, http: httpx.AsyncClient, transport: str, agent: str, text: str
) -> tuple[str, list[str], int]:
    """`agent`'s generate of `text` with ``topK`` (OpenAI lacks it) over `transport`: its status,
    the settings its warnings name, and its number of steps."""
    if transport == "http":
        body = {"messages": text, "modelSettings": {"topK": 5}}
        result = (await http.post(f"/api/agents/{agent}/generate", json=body)).json()
        return result["status"], [w["setting"] for w in result["warnings"]], len(result["steps"])
    request = apb.GenerateRequest(agent_id=agent, text=text, model_settings=apb.ModelSettings(top_k=5))
    async with agent_stub(service) as stub:
        response = await stub.Generate(request)
    return response.status, [w.setting for w in response.warnings], len(response.steps)


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_failed_runs_partial_warnings_are_logged_and_counted_once(
    service: Service, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    caplog.set_level(logging.WARNING)
    agent = f"fail-{transport}"
    before = await settings_ignored(http, "topK")
    status, _, steps = await _generate(service, http, transport, agent, "weather?")
    assert status == "failed"
    assert steps, "the partial result keeps the step before the refused model call"
    assert await settings_ignored(http, "topK") == before + 1
    assert len(_warned(caplog, agent)) == 1


@pytest.mark.parametrize("decision", ["approve", "decline"])
async def test_a_run_resumed_to_its_end_logs_and_counts_its_warnings(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, decision: str
) -> None:
    caplog.set_level(logging.WARNING)
    agent = f"ask-{decision}"
    before = await settings_ignored(http, "topK")
    body = {"messages": "weather?", "modelSettings": {"topK": 5}, "requireToolApproval": True}
    suspended = (await http.post(f"/api/agents/{agent}/generate", json=body)).json()
    assert suspended["status"] == "suspended", suspended
    assert suspended["steps"] == [], suspended  # a suspended run's result has no step yet
    caplog.clear()
    ask = {"runId": suspended["runId"], "toolCallId": suspended["suspendPayload"]["toolCallId"]}
    resumed = (await http.post(f"/api/agents/{agent}/{decision}-tool-call-generate", json=ask)).json()
    assert resumed["status"] == "success", resumed
    assert resumed["warnings"], "the resumed model call left topK out too"
    assert await settings_ignored(http, "topK") == before + 1  # once, as the run ends
    assert len(_warned(caplog, agent)) == 1


async def _counted(http: httpx.AsyncClient, setting: str, at_least: float) -> float:
    """``procmesh_call_settings_ignored_total{setting}`` once it reached `at_least` (a durable
    run is noted as it ends on its replica, which may be just after its client read its end)."""
    for _ in range(500):
        if (now := await settings_ignored(http, setting)) >= at_least:
            break
        await asyncio.sleep(0.02)
    return now


async def _streamed(service: Service, http: httpx.AsyncClient, transport: str, agent: str) -> list[Any]:
    """The chunks of `agent`'s stream of "hi" with ``topK`` (OpenAI lacks it), over `transport`."""
    if transport == "http":
        body = {"messages": "hi", "modelSettings": {"topK": 5}}
        return [c for c in await stream_chunks(http, agent, body) if isinstance(c, dict)]
    request = apb.StreamRequest(agent_id=agent, text="hi", model_settings=apb.ModelSettings(top_k=5))
    async with agent_stub(service) as stub:
        replies = [reply async for reply in stub.Stream(request)]
    assert replies[-1].status == "success"
    return [convert.chunk_from_proto(r.chunk) for r in replies if r.HasField("chunk")]


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_durable_streams_warnings_are_logged_and_counted_once(
    service: Service, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    caplog.set_level(logging.WARNING)
    before = await settings_ignored(http, "topK")
    chunks = await _streamed(service, http, transport, f"durable-{transport}")
    (start,) = [c for c in chunks if c["type"] == "step-start"]
    assert [w["setting"] for w in start["payload"]["warnings"]] == ["topK"]  # as a plain stream's
    assert await _counted(http, "topK", before + 1) == before + 1
    await asyncio.sleep(0.2)  # a second count would come as soon as the first
    assert await settings_ignored(http, "topK") == before + 1
    assert len(_warned(caplog, f"durable-{transport}")) == 1


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_durable_generates_warnings_are_logged_and_counted_once(
    service: Service, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    caplog.set_level(logging.WARNING)
    agent = f"durable-{transport}"
    before = await settings_ignored(http, "topK")
    assert (await _generate(service, http, transport, agent, "hi"))[:2] == ("success", ["topK"])
    assert await _counted(http, "topK", before + 1) == before + 1
    assert len(_warned(caplog, agent)) == 1


def _step_results(chunks: list[Any]) -> list[tuple[str, Any]]:
    """Each ``step-finish`` and ``finish`` chunk's type and ``payload.stepResult.warnings``."""
    ends = [c for c in chunks if isinstance(c, dict) and c["type"] in ("step-finish", "finish")]
    return [(c["type"], c["payload"]["stepResult"].get("warnings")) for c in ends]


@pytest.mark.parametrize("agent", ["gpt", "durable-http"])
async def test_an_http_streams_step_finish_and_finish_carry_the_results_warnings(
    http: httpx.AsyncClient, agent: str
) -> None:
    body = {"messages": "hi", "memory": {"thread": "t1", "resource": "r1"}, "modelSettings": {"topK": 5}}
    result = (await http.post(f"/api/agents/{agent}/generate", json=body)).json()
    assert [w["setting"] for w in result["warnings"]] == ["memory.thread", "topK"], result
    chunks = await stream_chunks(http, agent, body)
    # the call's own (a thread to an agent without memory), then its model call's (topK)
    expected = [("step-finish", result["warnings"]), ("finish", result["warnings"])]
    assert _step_results(chunks) == expected
    if agent.startswith("durable"):  # an observer is not the caller: the model calls' only
        run_id = next(c["runId"] for c in chunks if isinstance(c, dict))
        async with http.stream("POST", f"/api/agents/{agent}/observe", json={"runId": run_id}) as seen:
            observed = [json.loads(d) for d in [d async for d in sse_events(seen)] if d != "[DONE]"]
        model = result["warnings"][1:]
        assert _step_results(observed) == [("step-finish", model), ("finish", model)]


async def test_an_approved_runs_http_stream_carries_its_model_calls_warnings(http: httpx.AsyncClient) -> None:
    body = {"messages": "weather?", "modelSettings": {"topK": 5}, "requireToolApproval": True}
    suspended = (await http.post("/api/agents/ask-stream/generate", json=body)).json()
    assert suspended["status"] == "suspended", suspended
    ask = {"runId": suspended["runId"], "toolCallId": suspended["suspendPayload"]["toolCallId"]}
    async with http.stream("POST", "/api/agents/ask-stream/approve-tool-call", json=ask) as response:
        chunks = [json.loads(d) for d in [d async for d in sse_events(response)] if d != "[DONE]"]
    warnings = _step_results(chunks)
    assert warnings, chunks
    assert all([w["setting"] for w in found] == ["topK"] for _, found in warnings), warnings
    assert warnings[-1][0] == "finish"


async def test_a_stream_without_warnings_keeps_its_step_results_shape(http: httpx.AsyncClient) -> None:
    chunks = await stream_chunks(http, "gpt", {"messages": "hi", "modelSettings": {"temperature": 0.2}})
    assert _step_results(chunks) == [("step-finish", None), ("finish", None)]


@pytest.mark.parametrize("decision", ["approve", "decline"])
async def test_a_resumed_runs_grpc_stream_ends_with_its_model_calls_warnings(
    service: Service, decision: str
) -> None:
    agent = f"ask-grpc-{decision}"
    ask = apb.GenerateRequest(
        agent_id=agent, text="weather?", model_settings=apb.ModelSettings(top_k=5), require_tool_approval=True
    )
    async with agent_stub(service) as stub:
        suspended = await stub.Generate(ask)
        assert suspended.status == "suspended", suspended.error
        call = {
            "agent_id": agent,
            "run_id": suspended.run_id,
            "tool_call_id": suspended.suspended[0].tool_call_id,
        }
        if decision == "approve":
            replies = [r async for r in stub.ApproveToolCall(apb.ApproveToolCallRequest(**call))]
        else:
            replies = [r async for r in stub.DeclineToolCall(apb.DeclineToolCallRequest(**call))]
    *chunks, last = replies
    assert last.status == "success"
    # the suspended call's settings, which the resumed model call runs with (an approval has none)
    assert [(w.type, w.setting) for w in last.warnings] == [("unsupported-setting", "topK")]
    assert all(not r.warnings for r in chunks)
    starts = [convert.chunk_from_proto(r.chunk) for r in chunks if r.chunk.type == "step-start"]
    assert starts
    assert all(s["payload"]["warnings"] == [json_format.MessageToDict(last.warnings[0])] for s in starts)
