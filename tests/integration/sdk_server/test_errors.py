"""ProcessorServer on real sockets: what goes wrong gets its status code (a missing or unknown
processor, bad options, an unimplemented hook, a raising hook or a wrong result), and the client
raises the matching procmesh error; a message part of an unknown kind passes through untouched.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from procmesh import ProcessorClient, errors
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.integration.sdk_server.support import TIMEOUT, input_request, rpc_error, run_context

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
