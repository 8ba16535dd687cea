"""ProcessorServer on real sockets (TCP and a unix socket), called the way the orchestrator calls it.

One server per module hosts the small processors below; tests that stop a server start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import BaseModel

import procmesh
from procmesh import (
    HOOK_NAMES,
    SERVICE_NAME,
    MessageList,
    Processor,
    ProcessorClient,
    ProcessorServer,
    convert,
    errors,
)
from procmesh._processor import HOOK_ARGUMENTS
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.fixtures.censor import Censor, DataCensor

pytestmark = pytest.mark.asyncio(loop_scope="module")

Message = dict[str, Any]
Chunk = dict[str, Any]
TIMEOUT = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# -- message and chunk helpers -------------------------------------------------------


def text_message(msg_id: str, role: str, text: str, metadata: dict[str, Any] | None = None) -> Message:
    content: dict[str, Any] = {"format": 2, "parts": [{"type": "text", "text": text}]}
    if metadata:
        content["metadata"] = metadata
    return {"id": msg_id, "role": role, "content": content}


def text_of(msg: Message) -> str:
    return "".join(p.get("text", "") for p in msg["content"]["parts"] if p["type"] == "text")


def protos(*messages: Message) -> list[tpb.Message]:
    return [convert.message_to_proto(m) for m in messages]


def delta(text: str) -> Chunk:
    return {"type": "text-delta", "payload": {"id": "t1", "text": text}}


def run_context(
    processor_id: str,
    *,
    options: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    **kw: Any,
) -> tpb.RunContext:
    return tpb.RunContext(
        processor_id=processor_id,
        run_id="run-1",
        agent_id="agent-1",
        options=convert.to_struct(options),
        state=convert.to_struct(state),
        **kw,
    )


# -- processors under test -----------------------------------------------------------


class ShoutOptions(BaseModel):
    """Options of the shouter."""

    mode: Literal["list", "dict", "none"] = "list"
    suffix: str = "!"


class Shouter(Processor):
    """process_input in its three return shapes; process_output_result adds metadata."""

    id = "shouter"
    name = "Shouter"
    description = "Upper-cases the new input."
    Options = ShoutOptions

    async def process_input(
        self,
        messages: list[Message],
        system_messages: list[Message],
        message_list: MessageList,
        options: ShoutOptions,
        state: dict[str, Any],
    ) -> Any:
        state["calls"] = state.get("calls", 0) + 1
        state["seen"] = {
            "ids": [m["id"] for m in messages],
            "all_ids": [m["id"] for m in message_list.get_all()],
        }
        if options.mode == "none":
            return None
        if options.mode == "dict":
            return {"system_messages": [*system_messages, text_message("s2", "system", "Answer in English.")]}
        return [
            {
                **m,
                "content": {
                    **m["content"],
                    # Parts other than text are kept as they are (a newer kind's included).
                    "parts": [
                        {"type": "text", "text": text_of(m).upper() + options.suffix},
                        *(p for p in m["content"]["parts"] if p["type"] != "text"),
                    ],
                },
            }
            for m in messages
        ]

    async def process_output_result(self, messages: list[Message], result: dict[str, Any]) -> list[Message]:
        meta = {
            "chars": len(result["text"]),
            "finishReason": result["finishReason"],
            "usage": result["usage"],
        }
        return [{**m, "content": {**m["content"], "metadata": meta}} for m in messages]


class Planner(Processor):
    """Step overrides, prompt rewriting with a cached response, API error retries."""

    id = "planner"

    async def process_input_step(
        self,
        model: str,
        tools: list[dict[str, Any]],
        tool_choice: Any,
        active_tools: list[str],
        provider_options: dict[str, Any],
        step_number: int,
        retry_count: int,
        state: dict[str, Any],
    ) -> dict[str, Any]:
        state["seen"] = {
            "model": model,
            "tools": [t["name"] for t in tools],
            "tool_choice": tool_choice,
            "active_tools": active_tools,
            "provider_options": provider_options,
            "step": step_number,
            "retry": retry_count,
        }
        return {"tool_choice": "none", "model": "openai/gpt-4o-mini"}

    async def process_llm_request(self, prompt: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "prompt": [{"role": "system", "content": "Be brief."}, *prompt],
            "response": CACHED_RESPONSE,
        }

    async def process_api_error(self, error: dict[str, Any], retry_count: int) -> dict[str, Any]:
        return {"retry": error["status"] == 400 and retry_count == 0}


CACHED_RESPONSE: list[Chunk] = [
    delta("from cache"),
    {
        "type": "finish",
        "payload": {"finishReason": "stop", "usage": {"inputTokens": 0, "outputTokens": 2, "totalTokens": 2}},
    },
]


class Guard(Processor):
    """Aborts with retry, replaces tool results, and emits signals/custom chunks/violations."""

    id = "guard"

    async def process_output_step(self, text: str, abort: Any) -> list[Message]:
        if "forbidden" in text:
            abort("forbidden word in output", retry=True, metadata={"word": "forbidden", "score": 0.9})
        return []

    async def process_tool_result(self, tool_name: str, result: Any) -> Any:
        if tool_name == "secrets":
            return {"redacted": True, "keys": sorted(result)}
        return None

    async def process_llm_response(
        self,
        chunks: list[Chunk],
        send_signal: Any,
        writer: Any,
        report_violation: Any,
        state: dict[str, Any],
    ) -> None:
        text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
        await send_signal(
            {
                "type": "reactive",
                "contents": f"You wrote {len(text)} characters.",
                "tagName": "length-note",
                "attributes": {"zeta": 1, "alpha": "a", "mid": [1, 2]},
            }
        )
        await writer.custom({"type": "data-length", "data": {"chars": len(text)}, "transient": True})
        report_violation("long answer", {"chars": len(text)})
        state["history"].append(len(text))
        state["flags"][f"call{len(state['history'])}"] = True


class Faulty(Processor):
    """Hooks that raise or return what the contract does not allow."""

    id = "faulty"

    async def process_input(self) -> None:
        raise RuntimeError("boom")

    async def process_input_step(self) -> int:
        return 42

    async def process_output_step(self) -> str:
        return "not a list"

    async def process_output_result(self, state: dict[str, Any]) -> None:
        state["tags"] = {"a", "b"}  # a set has no JSON form


def _recording(hook: str) -> Any:
    async def record(self: Processor, **kwargs: Any) -> None:
        kwargs["state"][hook] = sorted(kwargs)

    return record


class Recorder(Processor):
    """Every hook takes **kwargs and records the argument names it was handed."""

    id = "recorder"
    process_input = _recording("process_input")
    process_input_step = _recording("process_input_step")
    process_llm_request = _recording("process_llm_request")
    process_llm_response = _recording("process_llm_response")
    process_output_stream = _recording("process_output_stream")
    process_output_step = _recording("process_output_step")
    process_tool_result = _recording("process_tool_result")
    process_output_result = _recording("process_output_result")
    process_api_error = _recording("process_api_error")
    execute_tool = _recording("execute_tool")


HOSTED_IDS = ["shouter", "planner", "guard", "censor", "data-censor", "faulty", "recorder"]


def processors() -> list[Processor]:
    return [Shouter(), Planner(), Guard(), Censor(), DataCensor(), Faulty(), Recorder()]


# -- fixtures ------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(sidecar_dir: Path) -> AsyncIterator[ProcessorServer]:
    addresses = ["127.0.0.1:0", f"unix://{sidecar_dir / 'sdk.sock'}"]
    async with ProcessorServer(processors(), addresses) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(server: ProcessorServer) -> AsyncIterator[dict[str, ProcessorClient]]:
    tcp, unix = server.addresses
    out = {"tcp": ProcessorClient(tcp), "unix": ProcessorClient(unix)}
    yield out
    for c in out.values():
        await c.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channels(server: ProcessorServer) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    tcp, unix = server.addresses
    out = {"tcp": grpc.aio.insecure_channel(tcp), "unix": grpc.aio.insecure_channel(unix)}
    yield out
    for c in out.values():
        await c.close()


@pytest.fixture
def client(clients: dict[str, ProcessorClient]) -> ProcessorClient:
    return clients["tcp"]


TRANSPORTS = pytest.mark.parametrize("transport", ["tcp", "unix"])


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- server surface: addresses, health, reflection, describe ----------------------------------


async def test_addresses_resolve_the_port_and_keep_the_unix_path(
    server: ProcessorServer, sidecar_dir: Path
) -> None:
    tcp, unix = server.addresses
    host, port = tcp.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) > 0
    assert unix == f"unix://{sidecar_dir / 'sdk.sock'}"
    assert server.processor_ids == HOSTED_IDS


async def test_unix_socket_file_is_group_accessible_only(sidecar_dir: Path, server: ProcessorServer) -> None:
    mode = os.stat(sidecar_dir / "sdk.sock").st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


@TRANSPORTS
@pytest.mark.parametrize("service", ["", SERVICE_NAME])
async def test_health_is_serving(channels: dict[str, grpc.aio.Channel], transport: str, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(channels[transport])
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
    assert resp.status == SERVING


async def test_health_of_an_unknown_service_is_not_found(channels: dict[str, grpc.aio.Channel]) -> None:
    stub = health_pb2_grpc.HealthStub(channels["tcp"])
    err = await rpc_error(stub.Check(health_pb2.HealthCheckRequest(service="nope.v1.Nope"), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.NOT_FOUND


@TRANSPORTS
async def test_client_health_reports_serving(clients: dict[str, ProcessorClient], transport: str) -> None:
    assert await clients[transport].health(timeout=TIMEOUT) == "SERVING"


async def test_reflection_lists_the_services_and_serves_the_contract(
    channels: dict[str, grpc.aio.Channel],
) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channels["tcp"])
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    responses = [r async for r in stub.ServerReflectionInfo(iter(requests), timeout=TIMEOUT)]
    assert len(responses) == 2
    names = {s.name for s in responses[0].list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in responses[1].file_descriptor_response.file_descriptor_proto
    ]
    contract = next(f for f in files if f.name == "procmesh/v1/processor.proto")
    (service,) = contract.service
    assert service.name == "ProcessorService"
    assert {"Describe", "ProcessInput", "ProcessOutputStream", "ProcessAPIError"} <= {
        m.name for m in service.method
    }


@TRANSPORTS
async def test_describe_lists_processors_hooks_and_options(
    clients: dict[str, ProcessorClient], transport: str
) -> None:
    resp = await clients[transport].describe(timeout=TIMEOUT)
    assert resp.sdk == f"procmesh-python/{procmesh.__version__}"
    assert [p.id for p in resp.processors] == HOSTED_IDS
    info = {p.id: p for p in resp.processors}
    assert list(info["shouter"].hooks) == [ppb.HOOK_PROCESS_INPUT, ppb.HOOK_PROCESS_OUTPUT_RESULT]
    assert list(info["planner"].hooks) == [
        ppb.HOOK_PROCESS_INPUT_STEP,
        ppb.HOOK_PROCESS_LLM_REQUEST,
        ppb.HOOK_PROCESS_API_ERROR,
    ]
    assert list(info["guard"].hooks) == [
        ppb.HOOK_PROCESS_LLM_RESPONSE,
        ppb.HOOK_PROCESS_OUTPUT_STEP,
        ppb.HOOK_PROCESS_TOOL_RESULT,
    ]
    assert list(info["censor"].hooks) == [ppb.HOOK_PROCESS_OUTPUT_STREAM]
    assert (info["shouter"].name, info["shouter"].description) == ("Shouter", "Upper-cases the new input.")
    assert info["planner"].name == "planner"  # name defaults to the id
    assert [p.id for p in resp.processors if p.process_data_parts] == ["data-censor"]
    schema = json.loads(info["shouter"].options_schema_json)
    # closed to unknown keys, as the hook's own check is: the orchestrator refuses them at start-up
    assert schema == {**ShoutOptions.model_json_schema(), "additionalProperties": False}
    assert schema["properties"]["mode"]["enum"] == ["list", "dict", "none"]
    assert all(p.options_schema_json == "" for p in resp.processors if p.id != "shouter")


# -- unary hooks, end to end ----------------------------------------------------------------

HISTORY = text_message("h1", "user", "earlier")
SYSTEM = text_message("s1", "system", "You are helpful.")


def input_request(options: dict[str, Any] | None = None) -> ppb.ProcessInputRequest:
    new = text_message("u1", "user", "hello", metadata={"lang": "en"})
    return ppb.ProcessInputRequest(
        context=run_context("shouter", options=options, state={"calls": 4}),
        messages=protos(new),
        all_messages=protos(HISTORY, new),
        system_messages=protos(SYSTEM),
    )


async def test_process_input_returning_a_list_replaces_the_messages(client: ProcessorClient) -> None:
    resp = await client.call("ProcessInput", input_request({"suffix": "?"}), TIMEOUT)
    assert resp.replace_messages
    assert not resp.replace_system_messages
    assert not resp.replace_all_messages
    (msg,) = [convert.message_from_proto(m) for m in resp.messages]
    assert msg == text_message("u1", "user", "HELLO?", metadata={"lang": "en"})
    assert convert.from_struct(resp.effects.state) == {
        "calls": 5,
        "seen": {"ids": ["u1"], "all_ids": ["h1", "u1"]},
    }
    assert not resp.effects.HasField("abort")


async def test_process_input_returning_a_dict_replaces_the_system_messages(client: ProcessorClient) -> None:
    resp = await client.call("ProcessInput", input_request({"mode": "dict"}), TIMEOUT)
    assert resp.replace_system_messages
    assert not resp.replace_messages
    assert len(resp.messages) == 0
    assert [convert.message_from_proto(m) for m in resp.system_messages] == [
        SYSTEM,
        text_message("s2", "system", "Answer in English."),
    ]


async def test_process_input_returning_none_changes_nothing_but_state(client: ProcessorClient) -> None:
    resp = await client.call("ProcessInput", input_request({"mode": "none"}), TIMEOUT)
    assert not resp.replace_messages
    assert not resp.replace_system_messages
    assert not resp.replace_all_messages
    assert len(resp.messages) == len(resp.system_messages) == len(resp.all_messages) == 0
    assert convert.from_struct(resp.effects.state)["calls"] == 5


async def test_process_input_step_returns_step_overrides(client: ProcessorClient) -> None:
    req = ppb.ProcessInputStepRequest(
        context=run_context("planner", step_number=2, retry_count=1),
        messages=protos(HISTORY),
        model="anthropic/claude-sonnet",
        tools=[
            tpb.ToolSpec(name="search", input_schema=convert.to_struct({"type": "object"})),
            tpb.ToolSpec(name="calc"),
        ],
        tool_choice=tpb.ToolChoice(mode="tool", tool_name="search"),
        active_tools=["search"],
        provider_options=convert.to_struct({"openai": {"store": False}}),
    )
    resp = await client.call("ProcessInputStep", req, TIMEOUT)
    assert resp.tool_choice.mode == "none"
    assert resp.HasField("model")
    assert resp.model == "openai/gpt-4o-mini"
    assert not resp.replace_messages
    assert not resp.replace_tools
    assert not resp.replace_active_tools
    assert not resp.HasField("provider_options")
    assert convert.from_struct(resp.effects.state)["seen"] == {
        "model": "anthropic/claude-sonnet",
        "tools": ["search", "calc"],
        "tool_choice": {"type": "tool", "toolName": "search"},
        "active_tools": ["search"],
        "provider_options": {"openai": {"store": False}},
        "step": 2,
        "retry": 1,
    }


async def test_process_llm_request_replaces_the_prompt_and_returns_a_cached_response(
    client: ProcessorClient,
) -> None:
    prompt: list[dict[str, Any]] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    req = ppb.ProcessLLMRequestRequest(context=run_context("planner"), model="openai/gpt-4o")
    convert.prompt_to_proto(prompt, req.prompt)
    resp = await client.call("ProcessLLMRequest", req, TIMEOUT)
    assert resp.replace_prompt
    assert convert.prompt_from_proto(resp.prompt) == [{"role": "system", "content": "Be brief."}, *prompt]
    assert resp.has_cached_response
    assert [convert.chunk_from_proto(c) for c in resp.cached_response] == CACHED_RESPONSE


async def test_process_output_step_abort_carries_retry_and_metadata(client: ProcessorClient) -> None:
    req = ppb.ProcessOutputStepRequest(
        context=run_context("guard", state={"kept": True}),
        messages=protos(HISTORY),
        text="this is forbidden",
        finish_reason="stop",
    )
    resp = await client.call("ProcessOutputStep", req, TIMEOUT)
    abort = convert.abort_from_proto(resp.effects.abort)
    assert abort == {
        "processorId": "",
        "reason": "forbidden word in output",
        "retry": True,
        "metadata": {"word": "forbidden", "score": 0.9},
    }
    assert not resp.replace_messages
    assert convert.from_struct(resp.effects.state) == {"kept": True}


async def test_process_output_step_returning_an_empty_list_changes_nothing(client: ProcessorClient) -> None:
    req = ppb.ProcessOutputStepRequest(context=run_context("guard"), messages=protos(HISTORY), text="fine")
    resp = await client.call("ProcessOutputStep", req, TIMEOUT)
    assert not resp.effects.HasField("abort")
    assert not resp.replace_messages
    assert len(resp.messages) == 0


@pytest.mark.parametrize(
    ("tool", "replaced"),
    [("secrets", {"redacted": True, "keys": ["api_key", "token"]}), ("weather", None)],
)
async def test_process_tool_result_replaces_the_result(
    client: ProcessorClient, tool: str, replaced: Any
) -> None:
    req = ppb.ProcessToolResultRequest(
        context=run_context("guard"),
        tool_name=tool,
        tool_call_id="call-1",
        args=convert.to_value({}),
        result=convert.to_value({"token": "t", "api_key": "k"}),
    )
    resp = await client.call("ProcessToolResult", req, TIMEOUT)
    assert resp.replace_result is (replaced is not None)
    if replaced is not None:
        assert convert.from_value(resp.result) == replaced


async def test_process_output_result_sets_message_metadata(client: ProcessorClient) -> None:
    answer = text_message("a1", "assistant", "Hello there")
    req = ppb.ProcessOutputResultRequest(
        context=run_context("shouter"),
        messages=protos(answer),
        result=tpb.OutputResult(
            text="Hello there",
            finish_reason="stop",
            usage=tpb.Usage(input_tokens=3, output_tokens=2, total_tokens=5),
        ),
    )
    resp = await client.call("ProcessOutputResult", req, TIMEOUT)
    assert resp.replace_messages
    (msg,) = [convert.message_from_proto(m) for m in resp.messages]
    assert msg["content"]["metadata"] == {
        "chars": 11,
        "finishReason": "stop",
        "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
    }
    assert msg["content"]["parts"] == answer["content"]["parts"]


@pytest.mark.parametrize(
    ("status", "retry_count", "retry"), [(400, 0, True), (400, 1, False), (500, 0, False)]
)
async def test_process_api_error_asks_for_a_retry(
    client: ProcessorClient, status: int, retry_count: int, retry: bool
) -> None:
    req = ppb.ProcessAPIErrorRequest(
        context=run_context("planner", retry_count=retry_count),
        error=tpb.APIError(status=status, message="rejected", retryable=False),
    )
    resp = await client.call("ProcessAPIError", req, TIMEOUT)
    assert resp.retry is retry
    assert not resp.replace_messages


async def test_signals_custom_chunks_and_violations_appear_in_effects(client: ProcessorClient) -> None:
    req = ppb.ProcessLLMResponseRequest(
        context=run_context("guard", state={"history": [], "flags": {}}),
        chunks=[convert.chunk_to_proto(delta("Hello")), convert.chunk_to_proto(delta(" world"))],
    )
    resp = await client.call("ProcessLLMResponse", req, TIMEOUT)
    (signal,) = resp.effects.signals
    assert (signal.type, signal.contents, signal.tag_name) == (
        "reactive",
        "You wrote 11 characters.",
        "length-note",
    )
    assert [a.name for a in signal.attributes] == ["zeta", "alpha", "mid"]
    assert convert.signal_from_proto(signal)["attributes"] == {"zeta": 1, "alpha": "a", "mid": [1, 2]}
    (custom,) = resp.effects.custom_chunks
    assert convert.chunk_from_proto(custom) == {
        "type": "data-length",
        "data": {"chars": 11},
        "transient": True,
    }
    (violation,) = resp.effects.violations
    assert violation.message == "long answer"
    assert convert.from_value(violation.detail) == {"chars": 11}


async def test_state_round_trips_through_consecutive_calls(client: ProcessorClient) -> None:
    # Empty containers in state must arrive as [] and {} (the hook appends/assigns into them).
    state: dict[str, Any] = {"history": [], "flags": {}, "note": "kept", "ratio": 0.5}
    for text in ("Hi", "Hello"):
        req = ppb.ProcessLLMResponseRequest(
            context=run_context("guard", state=state), chunks=[convert.chunk_to_proto(delta(text))]
        )
        resp = await client.call("ProcessLLMResponse", req, TIMEOUT)
        state = convert.from_struct(resp.effects.state)
    assert state == {"history": [2, 5], "flags": {"call1": True, "call2": True}, "note": "kept", "ratio": 0.5}


# -- errors ---------------------------------------------------------------------------


async def test_missing_processor_id_is_invalid_argument(client: ProcessorClient) -> None:
    err = await rpc_error(client.stub.ProcessInput(ppb.ProcessInputRequest(), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "request.context.processor_id is required"


async def test_options_failing_the_options_model_are_invalid_argument(client: ProcessorClient) -> None:
    err = await rpc_error(client.stub.ProcessInput(input_request({"mode": "whisper"}), timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert details.startswith("invalid options for processor 'shouter'")
    assert "mode" in details


async def test_a_message_part_of_an_unknown_kind_passes_through_untouched(client: ProcessorClient) -> None:
    # A newer orchestrator's part kind (field 15) beside a text part: the shouter upper-cases the
    # text and returns the message; the part it cannot read comes back byte for byte.
    msg = tpb.Message(id="u1", role="user", content=tpb.MessageContent(format=2))
    msg.content.parts.add().text.text = "hello"
    msg.content.parts.add().MergeFromString(b"\x7a\x06\x0a\x04soon")
    req = ppb.ProcessInputRequest(context=run_context("shouter"), messages=[msg], all_messages=[msg])
    resp = await client.stub.ProcessInput(req, timeout=TIMEOUT)
    assert resp.replace_messages
    parts = resp.messages[0].content.parts
    assert parts[0].text.text == "HELLO!"
    assert parts[1].SerializeToString() == b"\x7a\x06\x0a\x04soon"


async def test_the_client_raises_the_matching_procmesh_error(client: ProcessorClient) -> None:
    with pytest.raises(errors.InvalidInputError, match="processor_id is required"):
        await client.call("ProcessInput", ppb.ProcessInputRequest(), TIMEOUT)


async def test_unknown_processor_is_not_found(client: ProcessorClient) -> None:
    req = ppb.ProcessInputRequest(context=run_context("nope"))
    err = await rpc_error(client.stub.ProcessInput(req, timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "'nope' is not hosted here" in (err.details() or "")
    with pytest.raises(errors.NotFoundError):
        await client.call("ProcessInput", req, TIMEOUT)


async def test_unimplemented_hook_is_unimplemented(client: ProcessorClient) -> None:
    req = ppb.ProcessAPIErrorRequest(context=run_context("shouter"))
    err = await rpc_error(client.stub.ProcessAPIError(req, timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "processor 'shouter' does not implement process_api_error"


async def test_a_raising_hook_is_internal_naming_processor_and_hook(client: ProcessorClient) -> None:
    err = await rpc_error(
        client.stub.ProcessInput(ppb.ProcessInputRequest(context=run_context("faulty")), timeout=TIMEOUT)
    )
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == "processor 'faulty' hook process_input raised RuntimeError: boom"


@pytest.mark.parametrize(
    ("method", "request_type", "message"),
    [
        (
            "ProcessOutputStep",
            ppb.ProcessOutputStepRequest,
            "process_output_step returned str; expected a list of messages or None",
        ),
        ("ProcessInputStep", ppb.ProcessInputStepRequest, "process_input_step returned int; expected a dict"),
    ],
)
async def test_a_hook_returning_a_wrong_type_is_internal(
    client: ProcessorClient, method: str, request_type: Any, message: str
) -> None:
    req = request_type(context=run_context("faulty"))
    err = await rpc_error(getattr(client.stub, method)(req, timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert (err.details() or "").startswith(message)


async def test_a_hook_leaving_non_json_state_is_internal_not_the_callers_fault(
    client: ProcessorClient,
) -> None:
    req = ppb.ProcessOutputResultRequest(context=run_context("faulty"))
    err = await rpc_error(client.stub.ProcessOutputResult(req, timeout=TIMEOUT))
    assert err.code() == grpc.StatusCode.INTERNAL
    details = err.details() or ""
    assert "'faulty'" in details
    assert "set is not JSON-serializable" in details


# -- ProcessOutputStream ------------------------------------------------------------------


def stream_request(parts: list[tuple[int, Chunk]], context: tpb.RunContext | None = None) -> Any:
    req = ppb.ProcessOutputStreamRequest(
        parts=[ppb.StreamPart(seq=seq, part=convert.chunk_to_proto(chunk)) for seq, chunk in parts]
    )
    if context is not None:
        req.context.CopyFrom(context)
    return req


def result_chunks(resp: Any) -> list[tuple[int, Chunk | None]]:
    return [(r.seq, convert.chunk_from_proto(r.part) if r.HasField("part") else None) for r in resp.results]


async def finish(call: Any) -> dict[str, Any]:
    """Read the StreamEnd, check the stream then ends OK, and return the final state."""
    end = await call.read()
    assert end.HasField("end")
    assert len(end.results) == 0
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    return convert.from_struct(end.end.state)


@TRANSPORTS
async def test_stream_answers_parts_in_order_within_and_across_requests(
    clients: dict[str, ProcessorClient], transport: str
) -> None:
    call = clients[transport].open_stream(TIMEOUT)
    await call.write(
        stream_request([(1, delta("a")), (2, delta("up:b")), (3, delta("c"))], run_context("censor"))
    )
    assert result_chunks(await call.read()) == [(1, delta("a")), (2, delta("B")), (3, delta("c"))]
    # Later requests carry no context; the first one's applies to the whole stream.
    await call.write(stream_request([(4, delta("up:d")), (7, delta("e"))]))
    assert result_chunks(await call.read()) == [(4, delta("D")), (7, delta("e"))]
    await call.done_writing()
    assert await finish(call) == {"calls": 5}


async def test_stream_drops_a_part_when_the_hook_returns_none(client: ProcessorClient) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(
        stream_request([(1, delta("a")), (2, delta("drop")), (3, delta("c"))], run_context("censor"))
    )
    assert result_chunks(await call.read()) == [(1, delta("a")), (2, None), (3, delta("c"))]
    await call.done_writing()
    assert await finish(call) == {"calls": 3}


async def test_stream_abort_stops_the_stream_and_ends_with_the_state(client: ProcessorClient) -> None:
    call = client.open_stream(TIMEOUT)
    parts = [(1, delta("a")), (2, delta("stop")), (3, delta("never seen"))]
    await call.write(stream_request(parts, run_context("censor", state={"calls": 10})))
    resp = await call.read()
    assert [r.seq for r in resp.results] == [1, 2]
    aborted = resp.results[1]
    assert not aborted.HasField("part")
    assert convert.abort_from_proto(aborted.effects.abort) == {
        "processorId": "",
        "reason": "stop word",
        "retry": False,
        "metadata": {"at": 2},
    }
    assert not resp.results[0].effects.HasField("abort")
    # StreamEnd comes at once, without the half-close; the call itself stays open until the
    # client half-closes, so a write already on its way cannot fail and hide the abort.
    end = await call.read()
    assert end.HasField("end")
    assert convert.from_struct(end.end.state) == {"calls": 12}
    await call.write(stream_request([(4, delta("ignored after the abort"))]))
    assert not call.done()
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_stream_passes_data_parts_through_untouched(client: ProcessorClient) -> None:
    data = {"type": "data-card", "data": {"items": [], "n": 1.5, "nested": {}}, "transient": True}
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, data), (2, delta("a"))], run_context("censor")))
    resp = await call.read()
    assert resp.results[0].part == convert.chunk_to_proto(data)
    assert result_chunks(resp) == [(1, data), (2, delta("a"))]
    await call.done_writing()
    assert await finish(call) == {"calls": 1}  # the hook never saw the data part


async def test_stream_hands_data_parts_to_processors_that_ask(client: ProcessorClient) -> None:
    data = {"type": "data-card", "data": {"n": 1}}
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, data), (2, delta("up:a"))], run_context("data-censor")))
    assert result_chunks(await call.read()) == [
        (1, {"type": "data-card", "data": {"seen_by": "data-censor"}}),
        (2, delta("A")),
    ]
    await call.done_writing()
    assert await finish(call) == {"calls": 2}


async def test_stream_custom_chunk_is_in_the_effects_of_its_part(client: ProcessorClient) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(
        stream_request([(1, delta("a")), (2, delta("emit")), (3, delta("b"))], run_context("censor"))
    )
    resp = await call.read()
    assert [len(r.effects.custom_chunks) for r in resp.results] == [0, 1, 0]
    custom = convert.chunk_from_proto(resp.results[1].effects.custom_chunks[0])
    assert custom == {"type": "data-note", "data": {"parts_so_far": 2}}
    assert result_chunks(resp)[1] == (2, delta("emit"))
    await call.done_writing()
    await finish(call)


async def test_stream_with_no_parts_still_ends_with_the_state(client: ProcessorClient) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([], run_context("censor", state={"calls": 3})))
    assert len((await call.read()).results) == 0
    await call.done_writing()
    assert await finish(call) == {"calls": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("boom", "processor 'censor' hook process_output_stream raised RuntimeError: stream exploded"),
        ("bad", "process_output_stream returned str; expected a chunk dict, a list of them, or None"),
    ],
)
async def test_stream_hook_failures_are_internal(client: ProcessorClient, text: str, message: str) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, delta("a")), (2, delta(text))], run_context("censor")))
    err = await rpc_error(call.read())
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == message


@pytest.mark.parametrize(
    ("context", "code", "message"),
    [
        (None, grpc.StatusCode.INVALID_ARGUMENT, "request.context.processor_id is required"),
        (run_context("shouter"), grpc.StatusCode.UNIMPLEMENTED, "does not implement process_output_stream"),
        (run_context("ghost"), grpc.StatusCode.NOT_FOUND, "'ghost' is not hosted here"),
    ],
)
async def test_stream_rejects_a_bad_first_request(
    client: ProcessorClient, context: tpb.RunContext | None, code: grpc.StatusCode, message: str
) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, delta("a"))], context))
    err = await rpc_error(call.read())
    assert err.code() == code
    assert message in (err.details() or "")


# -- the argument table ------------------------------------------------------------------


UNARY_METHODS = {
    "process_input": ("ProcessInput", ppb.ProcessInputRequest),
    "process_input_step": ("ProcessInputStep", ppb.ProcessInputStepRequest),
    "process_llm_request": ("ProcessLLMRequest", ppb.ProcessLLMRequestRequest),
    "process_llm_response": ("ProcessLLMResponse", ppb.ProcessLLMResponseRequest),
    "process_output_step": ("ProcessOutputStep", ppb.ProcessOutputStepRequest),
    "process_tool_result": ("ProcessToolResult", ppb.ProcessToolResultRequest),
    "process_output_result": ("ProcessOutputResult", ppb.ProcessOutputResultRequest),
    "process_api_error": ("ProcessAPIError", ppb.ProcessAPIErrorRequest),
    "execute_tool": ("ExecuteTool", ppb.ExecuteToolRequest),
}


async def test_every_hook_has_an_rpc() -> None:
    assert sorted([*UNARY_METHODS, "process_output_stream"]) == sorted(HOOK_NAMES)


@pytest.mark.parametrize("hook", UNARY_METHODS)
async def test_a_kwargs_hook_is_handed_exactly_the_documented_arguments(
    client: ProcessorClient, hook: str
) -> None:
    # HOOK_ARGUMENTS decides at startup which declared names are accepted; the servicer must
    # hand every one of them, or a hook declaring it fails at call time.
    method, request_type = UNARY_METHODS[hook]
    resp = await client.call(method, request_type(context=run_context("recorder")), TIMEOUT)
    assert convert.from_struct(resp.effects.state) == {hook: sorted(HOOK_ARGUMENTS[hook])}


async def test_the_stream_hook_is_handed_exactly_the_documented_arguments(client: ProcessorClient) -> None:
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, delta("a"))], run_context("recorder")))
    assert result_chunks(await call.read()) == [(1, None)]
    await call.done_writing()
    assert await finish(call) == {"process_output_stream": sorted(HOOK_ARGUMENTS["process_output_stream"])}


# -- metrics --------------------------------------------------------------------------


def hook_calls(server: ProcessorServer, processor: str, hook: str, outcome: str) -> float:
    labels = {"processor": processor, "hook": hook, "outcome": outcome}
    return server.registry.get_sample_value("procmesh_sidecar_hook_calls_total", labels) or 0.0


def stream_parts(server: ProcessorServer, processor: str, outcome: str) -> float:
    labels = {"processor": processor, "outcome": outcome}
    return server.registry.get_sample_value("procmesh_sidecar_stream_parts_total", labels) or 0.0


async def test_hook_calls_are_counted_by_processor_hook_and_outcome(
    server: ProcessorServer, client: ProcessorClient
) -> None:
    watched = [
        ("shouter", "process_input", "ok"),
        ("faulty", "process_input", "internal"),
        ("guard", "process_output_step", "abort"),
        ("censor", "process_output_stream", "ok"),
        ("censor", "process_output_stream", "abort"),
    ]
    before = {key: hook_calls(server, *key) for key in watched}
    parts_before = {o: stream_parts(server, "censor", o) for o in ("ok", "abort")}
    latency_labels = {"processor": "shouter", "hook": "process_input"}
    latency_before = server.registry.get_sample_value(
        "procmesh_sidecar_hook_duration_seconds_count", latency_labels
    )

    await client.call("ProcessInput", input_request(), TIMEOUT)
    with pytest.raises(errors.InternalError):
        await client.call("ProcessInput", ppb.ProcessInputRequest(context=run_context("faulty")), TIMEOUT)
    step = ppb.ProcessOutputStepRequest(context=run_context("guard"), text="forbidden")
    await client.call("ProcessOutputStep", step, TIMEOUT)
    call = client.open_stream(TIMEOUT)
    await call.write(
        stream_request([(1, delta("a")), (2, delta("b")), (3, delta("stop"))], run_context("censor"))
    )
    await call.read()
    await call.done_writing()  # after the abort the call ends on the half-close
    await finish(call)
    clean = client.open_stream(TIMEOUT)  # a stream that ends: one call, two parts
    await clean.write(stream_request([(1, delta("c")), (2, delta("d"))], run_context("censor")))
    await clean.read()
    await clean.done_writing()
    await finish(clean)

    after = {key: hook_calls(server, *key) for key in watched}
    assert {key: after[key] - before[key] for key in watched} == {
        ("shouter", "process_input", "ok"): 1,
        ("faulty", "process_input", "internal"): 1,
        ("guard", "process_output_step", "abort"): 1,
        # one call per stream session, whatever its parts (they are counted apart)
        ("censor", "process_output_stream", "ok"): 1,
        ("censor", "process_output_stream", "abort"): 1,
    }
    parts = {o: stream_parts(server, "censor", o) - parts_before[o] for o in ("ok", "abort")}
    assert parts == {"ok": 4, "abort": 1}
    latency_after = server.registry.get_sample_value(
        "procmesh_sidecar_hook_duration_seconds_count", latency_labels
    )
    assert (latency_after or 0) - (latency_before or 0) == 1


async def test_a_streams_parts_are_recorded_once_per_batch_with_unchanged_totals(
    server: ProcessorServer, client: ProcessorClient
) -> None:
    labels = {"processor": "censor", "hook": "process_output_stream"}

    def latency_count() -> float:
        return server.registry.get_sample_value("procmesh_sidecar_hook_duration_seconds_count", labels) or 0.0

    parts_before, count_before = stream_parts(server, "censor", "ok"), latency_count()
    call = client.open_stream(TIMEOUT)
    await call.write(
        stream_request([(1, delta("a")), (2, delta("b")), (3, delta("c"))], run_context("censor"))
    )
    await call.read()
    await call.write(stream_request([(4, delta("d")), (5, delta("e"))]))
    await call.read()
    await call.done_writing()
    await finish(call)
    assert stream_parts(server, "censor", "ok") - parts_before == 5  # every part, as before
    assert latency_count() - count_before == 2  # one latency observation per batch, not per part


# -- lifecycle (own servers: these stop them) ---------------------------------------------------


class Lifecycle(Processor):
    """Records setup/teardown; setup waits until the test releases it.

    Threading events, not asyncio ones: setup runs on the processor's hook loop, another thread.
    """

    id = "lifecycle"

    def __init__(self) -> None:
        self.in_setup = threading.Event()
        self.release = threading.Event()
        self.torn_down = False

    async def setup(self) -> None:
        self.in_setup.set()
        await asyncio.to_thread(self.release.wait, TIMEOUT)

    async def teardown(self) -> None:
        self.torn_down = True

    async def process_input(self) -> None:
        return None


async def _health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    req = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    resp = await stub.Check(req, timeout=TIMEOUT, wait_for_ready=True)
    return int(resp.status)


async def test_health_turns_serving_only_after_setup_returns() -> None:
    proc = Lifecycle()
    server = ProcessorServer([proc], ["127.0.0.1:0"])
    starting = asyncio.create_task(server.start())
    try:
        # setup() runs after the ports are bound and the server started.
        assert await asyncio.to_thread(proc.in_setup.wait, TIMEOUT)
        async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
            assert await _health(channel) == NOT_SERVING
            proc.release.set()
            await asyncio.wait_for(starting, TIMEOUT)
            assert await _health(channel) == SERVING
    finally:
        proc.release.set()
        await starting
        await server.stop(grace=0)


async def test_graceful_stop_reports_not_serving_then_removes_the_socket(sidecar_dir: Path) -> None:
    path = sidecar_dir / "stop.sock"
    proc = Lifecycle()
    proc.release.set()
    server = ProcessorServer([proc], [f"unix://{path}"])
    await server.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        async with grpc.aio.insecure_channel(server.addresses[0]) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watches = [
                stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
                for service in ("", SERVICE_NAME)
            ]
            assert [(await w.read()).status for w in watches] == [SERVING, SERVING]
            stopping = asyncio.create_task(server.stop(grace=TIMEOUT))
            statuses = [(await asyncio.wait_for(w.read(), TIMEOUT)).status for w in watches]
            assert statuses == [NOT_SERVING, NOT_SERVING]
            for w in watches:
                w.cancel()
            await asyncio.wait_for(stopping, TIMEOUT)
    finally:
        await server.stop(grace=0)
    assert not path.exists()
    assert proc.torn_down
