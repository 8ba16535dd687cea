"""The hook table drives the SDK server: every RPC of the service is registered from it."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from procmesh import _decode, _encode, hooks
from procmesh._message_list import MessageList
from procmesh._metrics import SidecarMetrics
from procmesh._servicer import SERVICE_NAME, Servicer
from procmesh.v1 import processor_pb2 as ppb


def test_every_hook_has_its_own_decoder_and_encoder() -> None:
    for hook in hooks.HOOKS:
        assert hook.decode is getattr(_decode, hook.name)
        assert hook.encode is getattr(_encode, hook.name)


def test_the_table_follows_the_proto_enum_and_service() -> None:
    service = ppb.DESCRIPTOR.services_by_name["ProcessorService"]
    assert service.full_name == SERVICE_NAME
    assert [h.enum for h in hooks.HOOKS] == sorted(h.enum for h in hooks.HOOKS)
    assert {m.name for m in service.methods} == {"Describe"} | {h.rpc for h in hooks.HOOKS}
    for hook in hooks.HOOKS:
        method = service.methods_by_name[hook.rpc]
        assert method.input_type is hook.request.DESCRIPTOR
        assert method.output_type is hook.response.DESCRIPTOR
        assert method.client_streaming == method.server_streaming == hook.streaming


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[Any, ...] = ()


def test_the_generic_handler_serves_every_rpc_with_the_right_shape() -> None:
    handler = Servicer({}, SidecarMetrics(CollectorRegistry())).handler()
    for hook in hooks.HOOKS:
        found = handler.service(_Details(f"/{SERVICE_NAME}/{hook.rpc}"))
        assert found is not None, hook.rpc
        assert (found.request_streaming, found.response_streaming) == (hook.streaming, hook.streaming)
        # Requests arrive as bytes: the handler decodes them with hook.request itself, so that an
        # undecodable one is INVALID_ARGUMENT rather than grpc.aio's UNKNOWN (tests/integration).
        assert found.request_deserializer is None
        assert found.response_serializer is not None
        assert found.response_serializer(hook.response()) == hook.response().SerializeToString()
    assert handler.service(_Details(f"/{SERVICE_NAME}/Describe")) is not None
    assert handler.service(_Details(f"/{SERVICE_NAME}/NoSuchRpc")) is None


@pytest.mark.parametrize("hook", [h for h in hooks.HOOKS if not h.streaming], ids=lambda h: h.name)
def test_decode_gives_only_arguments_the_hook_may_declare(hook: hooks.Hook) -> None:
    decoded = hook.decode(hook.request())
    assert set(decoded) <= hook.arguments
    # The arguments every hook gets come from the RunContext in the servicer, not from a decoder.
    assert not set(decoded) & {"state", "options", "abort", "send_signal", "writer", "run_id"}


@pytest.mark.parametrize("hook", [h for h in hooks.HOOKS if not h.streaming], ids=lambda h: h.name)
def test_encode_of_no_change_is_an_empty_response(hook: hooks.Hook) -> None:
    kwargs = hook.decode(hook.request())
    result: Any = None
    if hook.name == "execute_tool":
        result = {"ok": True}
    resp = hook.encode(result, kwargs)
    assert isinstance(resp, hook.response)
    if hook.name == "execute_tool":
        assert resp.HasField("result")
    else:
        assert resp == hook.response()


def test_encode_sends_back_in_place_edits_of_the_message_list() -> None:
    hook = hooks.BY_NAME["process_output_step"]
    kwargs = hook.decode(ppb.ProcessOutputStepRequest())
    message_list: MessageList = kwargs["message_list"]
    message_list.add({"id": "m1", "role": "user", "content": {"format": 2, "parts": []}})
    resp = hook.encode(message_list, kwargs)
    assert resp.replace_messages
    assert [m.id for m in resp.messages] == ["m1"]


def test_the_stream_codec_works_per_part() -> None:
    hook = hooks.BY_NAME["process_output_stream"]
    item = ppb.StreamPart(seq=1)
    item.part.type = "text-delta"
    assert hook.decode(item)["part"]["type"] == "text-delta"
    res = hook.encode([{"type": "text-delta", "payload": {"id": "t", "text": "a"}}, {"type": "data-x"}], {})
    assert isinstance(res, ppb.StreamPartResult)
    assert res.part.type == "text-delta"
    assert [p.type for p in res.extra_parts] == ["data-x"]
    assert hook.encode(None, {}) == ppb.StreamPartResult()
