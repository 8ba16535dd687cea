"""The call options and result fields of the gRPC `AgentService`, through a real orchestrator.

Two `procmesh-orchestrator` processes over one `examples` sidecar: one that trusts its callers
(per-call processor lists are honoured) and one that does not (PERMISSION_DENIED). The options
are the HTTP body's (tests/e2e/service/test_clientjs_options.py), converted by the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import struct_pb2

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEY, API_KEYS, demo_answer, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

METADATA = (("authorization", f"Bearer {API_KEY}"),)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp": {"type": "number"}},
    "required": ["city", "temp"],
}
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")
ASK = "What is the weather in Paris?"


def _config(address: str) -> dict[str, Any]:
    config = service_config({"guards": address})
    plain = {"errorProcessorDefaults": False}
    answer = '{"city": "Paris", "temp": 21}'
    config["models"]["json"] = {"provider": "scripted", "responses": [{"text": answer}] * 20}
    config["tools"] = {
        "weather": {"description": "Weather", "inputSchema": {"type": "object"}, "result": {"sky": "clear"}}
    }
    config["agents"] |= {
        "json": {"model": "json", **plain},
        "tools": {"model": "demo", "tools": ["weather"], **plain},
    }
    return config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrators(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> tuple[OrchestratorProcess, OrchestratorProcess]:
    sidecar = start_sidecar("examples", name="grpc-options-guards")
    await sidecar.wait_ready()
    config = _config(sidecar.address)
    # the same key: an operator key on the first (it may replace lanes), a tenant's on the second
    trusted = await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": API_KEYS})
    tenant = {"PROCMESH_API_KEYS": f"{API_KEY}=tenant-a"}
    untrusted = await asyncio.to_thread(start_orchestrator, config, env=tenant)
    return trusted, untrusted


async def _stub(orchestrator: OrchestratorProcess) -> AsyncIterator[agrpc.AgentServiceStub]:
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        yield agrpc.AgentServiceStub(channel)


@pytest_asyncio.fixture(loop_scope="module")
async def stub(
    orchestrators: tuple[OrchestratorProcess, OrchestratorProcess],
) -> AsyncIterator[agrpc.AgentServiceStub]:
    async for stub in _stub(orchestrators[0]):
        yield stub


async def _generate(stub: agrpc.AgentServiceStub, **fields: Any) -> apb.GenerateResponse:
    response: apb.GenerateResponse = await stub.Generate(apb.GenerateRequest(**fields), metadata=METADATA)
    return response


async def _chunks(stub: agrpc.AgentServiceStub, **fields: Any) -> list[dict[str, Any]]:
    return [
        convert.chunk_from_proto(reply.chunk)
        async for reply in stub.Stream(apb.StreamRequest(**fields), metadata=METADATA)
        if reply.HasField("chunk")
    ]


def _refused(error: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> tuple[grpc.StatusCode, str]:
    return error.value.code(), str(error.value.details())


def _structured() -> apb.StructuredOutput:
    schema = struct_pb2.Struct()
    schema.update(SCHEMA)
    return apb.StructuredOutput(schema=schema, error_strategy="strict")


async def test_structured_output_gives_the_object(stub: agrpc.AgentServiceStub) -> None:
    response = await _generate(stub, agent_id="json", text="weather?", structured_output=_structured())
    assert response.status == "success"
    assert response.HasField("object")
    assert convert.from_value(response.object) == {"city": "Paris", "temp": 21}
    chunks = await _chunks(stub, agent_id="json", text="weather?", structured_output=_structured())
    (result,) = [c for c in chunks if c["type"] == "object-result"]
    assert result["payload"]["object"] == {"city": "Paris", "temp": 21}
    plain = await _generate(stub, agent_id="json", text="weather?")
    assert not plain.HasField("object")


async def test_a_tool_run_has_the_references_result_fields(stub: agrpc.AgentServiceStub) -> None:
    response = await _generate(stub, agent_id="tools", text=ASK)
    assert [(c.tool_name, convert.from_value(c.args)) for c in response.tool_calls] == [
        ("weather", {"city": "Paris"})
    ]
    (result,) = response.tool_results
    assert (result.tool_call_id, convert.from_value(result.result)) == (
        response.tool_calls[0].tool_call_id,
        {"sky": "clear"},
    )
    assert response.total_usage == response.usage
    assert response.total_usage.total_tokens > 0
    assert [m.role for m in response.response_messages] == ["assistant", "assistant"]
    assert response.trace_id == ""  # tracing is off


@pytest.mark.parametrize(
    "option",
    [{"tool_choice": tpb.ToolChoice(mode="none")}, {"active_tools": apb.ToolNames(names=[])}],
    ids=["tool_choice-none", "no-active-tools"],
)
async def test_tool_options_keep_the_model_from_calling(
    stub: agrpc.AgentServiceStub, option: dict[str, Any]
) -> None:
    response = await _generate(
        stub,
        agent_id="tools",
        text=ASK,
        instructions="Be short.",
        system=["Answer in English."],
        model_settings=apb.ModelSettings(temperature=0.1, max_output_tokens=200, seed=7),
        **option,
    )
    assert (response.status, list(response.tool_calls)) == ("success", [])
    assert response.text == demo_answer(ASK)  # the tools agent has no output processors


async def test_violations_reach_the_caller(stub: agrpc.AgentServiceStub) -> None:
    response = await _generate(stub, agent_id="assistant", text="please jailbreak")
    assert response.status == "tripwire"
    (violation,) = response.violations
    assert violation.processor_id == "topic-guard"
    assert violation.message == "Blocked: the request mentions 'jailbreak'"
    kinds = [c["type"] for c in await _chunks(stub, agent_id="assistant", text="please jailbreak")]
    assert kinds.index("data-procmesh-violation") < kinds.index("tripwire")


async def test_a_thread_given_to_an_agent_without_memory_is_a_warning(stub: agrpc.AgentServiceStub) -> None:
    """The HTTP result's `warnings` over gRPC: the run goes on, the caller learns nothing is kept."""
    fields = {"agent_id": "json", "text": "weather?", "thread_id": "t1", "resource_id": "r1"}
    response = await _generate(stub, **fields)
    assert response.status == "success"
    assert [(w.type, w.setting) for w in response.warnings] == [("unsupported-setting", "memory.thread")]
    assert response.warnings[0].details
    replies = [r async for r in stub.Stream(apb.StreamRequest(**fields), metadata=METADATA)]
    assert [w.setting for w in replies[-1].warnings] == ["memory.thread"]
    assert not (await _generate(stub, agent_id="json", text="weather?")).warnings


def _with_file(file: tpb.FilePart) -> tpb.Message:
    parts = [tpb.Part(text=tpb.TextPart(text="what is this?")), tpb.Part(file=file)]
    return tpb.Message(role="user", content=tpb.MessageContent(format=2, parts=parts))


async def test_file_parts_reach_the_run(stub: agrpc.AgentServiceStub) -> None:
    image = _with_file(tpb.FilePart(media_type="image/png", data=PNG, filename="dot.png"))
    response = await _generate(stub, agent_id="assistant", messages=[image])
    assert response.status == "success"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _generate(stub, agent_id="assistant", messages=[_with_file(tpb.FilePart(data=PNG))])
    assert _refused(error) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "messages.0.content.parts.1.file.media_type: a file part needs one",
    )


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"model_settings": apb.ModelSettings(top_p=2)}, "modelSettings.topP"),
        ({"tool_choice": tpb.ToolChoice(mode="sometimes")}, "toolChoice"),
        # the named tool was dropped: a run where the model may call any tool, or none
        (
            {"tool_choice": tpb.ToolChoice(mode="required", tool_name="weather")},
            "tool_choice.tool_name: names the tool of mode 'tool' only (mode is 'required')",
        ),
        ({"tool_choice": tpb.ToolChoice(tool_name="weather")}, "tool_choice.tool_name"),
        ({"structured_output": apb.StructuredOutput(error_strategy="strict")}, "structuredOutput.schema"),
        (
            {"structured_output": apb.StructuredOutput(schema=struct_pb2.Struct(), error_strategy="ignore")},
            "errorStrategy",
        ),
    ],
)
async def test_a_bad_option_is_invalid_argument(
    stub: agrpc.AgentServiceStub, fields: dict[str, Any], error: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _generate(stub, agent_id="assistant", text="hi", **fields)
    code, details = _refused(refused)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert error in details


async def test_per_call_processor_lists_replace_the_agents_lanes(stub: agrpc.AgentServiceStub) -> None:
    none = await _generate(
        stub, agent_id="assistant", text="please jailbreak", input_processors=apb.ProcessorList()
    )
    assert (none.status, none.text) == ("success", demo_answer("please jailbreak").replace("Darn", "****"))
    fields = {
        "agent_id": "assistant",
        "text": "mail ada@example.com",
        "input_processors": apb.ProcessorList(ids=["pii-redactor"]),
        "output_processors": apb.ProcessorList(),
    }
    assert (await _generate(stub, **fields)).text == demo_answer("mail [email]")
    streamed = await _chunks(stub, **fields)
    assert "".join(c["payload"]["text"] for c in streamed if c["type"] == "text-delta") == demo_answer(
        "mail [email]"
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _generate(
            stub, agent_id="assistant", text="hi", error_processors=apb.ProcessorList(ids=["nope"])
        )
    code, details = _refused(error)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("errorProcessors.0: unknown processor 'nope' (known: ")


async def test_an_untrusted_caller_may_not_replace_the_lanes(
    orchestrators: tuple[OrchestratorProcess, OrchestratorProcess],
) -> None:
    async for stub in _stub(orchestrators[1]):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await _generate(stub, agent_id="assistant", text="hi", input_processors=apb.ProcessorList())
        code, details = _refused(error)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert details.startswith("inputProcessors: replacing an agent's processors needs an operator key")
        # the same call without the list runs, with the agent's guard
        assert (await _generate(stub, agent_id="assistant", text="please jailbreak")).status == "tripwire"
