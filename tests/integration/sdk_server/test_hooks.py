"""ProcessorServer on real sockets, called the way the orchestrator calls it: each unary hook end
to end (what it returns becomes the response, effects and state), and every hook handed exactly
its documented arguments.
"""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import HOOK_NAMES, ProcessorClient, convert
from procmesh._processor import HOOK_ARGUMENTS
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.integration.sdk_server.support import (
    CACHED_RESPONSE,
    HISTORY,
    SYSTEM,
    TIMEOUT,
    delta,
    finish,
    input_request,
    protos,
    result_chunks,
    run_context,
    stream_request,
    text_message,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


# -- unary hooks, end to end ----------------------------------------------------------------


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
