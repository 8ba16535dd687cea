"""A run's caller reuses each message's encoding while the message is unchanged
(`processors.encodings`), and each processor's RunContext while what it carries is
(`GrpcHookCaller.context_field`): a sidecar sees exactly what a fresh conversion would send, also
after a message dict was changed in place, down to a boolean that became the number it equals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import struct_pb2

from procmesh import MessageList, Processor, ProcessorClient, ProcessorServer, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import RunInfo
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import GrpcHookCaller, wire
from procmesh_orchestrator.processors.encodings import MessageEncodings
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.run.hooks import InputArgs


class Recorder(Processor):
    """Keeps the messages of every processInput it is given."""

    id = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[dict[str, Any]]] = []

    async def process_input(self, messages: list[dict[str, Any]]) -> None:
        self.seen.append(messages)


def step(messages: list[dict[str, Any]]) -> InputArgs:
    return InputArgs(messages=messages, all_messages=messages, system_messages=[])


def conversation() -> list[dict[str, Any]]:
    call = {"state": "call", "toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris", "days": 2}}
    return [
        {"id": "u", "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]}},
        {
            "id": "a",
            "role": "assistant",
            "content": {
                "format": 2,
                "parts": [{"type": "tool-invocation", "toolInvocation": call}],
                "metadata": {"flag": True, "score": 1},
            },
        },
    ]


def sent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a sidecar is given for `messages` converted afresh."""
    return [convert.message_from_proto(convert.message_to_proto(m)) for m in messages]


async def test_a_sidecar_sees_each_in_place_change_of_a_reused_message() -> None:
    recorder = Recorder()
    messages = conversation()
    tool_call = messages[1]["content"]["parts"][0]["toolInvocation"]
    metadata = messages[1]["content"]["metadata"]
    changes: list[Callable[[], object]] = [
        lambda: None,  # unchanged: the encodings are reused
        lambda: messages[0]["content"]["parts"][0].update(text="hello"),
        lambda: tool_call.update(state="result", result={"temp": 21}),
        lambda: metadata.update(flag=1),  # equal to True, but sent as a number
        lambda: metadata.update(score=1.5),
        lambda: tool_call["args"].update(days=True),
        lambda: messages.append(messages[0]),  # the same dict twice
    ]
    async with ProcessorServer([recorder]) as server, ProcessorClient(server.addresses[0]) as client:
        handle = wire_handle(client)
        caller = GrpcHookCaller(RunInfo(run_id="r", agent_id="a", request_context={}), OrchestratorMetrics())
        for change in changes:
            change()
            await caller.call(handle, step(messages))
            assert recorder.seen[-1] == sent(messages)
            # compared as messages: a Struct's map entries may serialize in either order
            encoded = wire.encode_request(step(messages), caller.encodings)
            assert ppb.ProcessInputRequest.FromString(encoded) == wire.build_request(step(messages))
    assert metadata == {"flag": 1, "score": 1.5}
    assert recorder.seen[3][1]["content"]["metadata"]["flag"] == 1
    assert recorder.seen[2][1]["content"]["metadata"]["flag"] is True


class ContextRecorder(Processor):
    """Keeps what each processInput's RunContext gave it."""

    id = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []

    async def process_input(
        self,
        step_number: int,
        retry_count: int,
        state: dict[str, Any],
        request_context: dict[str, Any],
        message_list: MessageList,
    ) -> None:
        sources = tuple(m["id"] for m in message_list.get.response.db())
        self.seen.append((step_number, retry_count, dict(state), dict(request_context), sources))


async def test_a_sidecar_sees_each_change_of_a_reused_run_context() -> None:
    recorder = ContextRecorder()
    info = RunInfo(run_id="r", agent_id="a", request_context={"user": "u1"})
    messages = conversation()
    changes: list[Callable[[], object]] = [
        lambda: None,  # unchanged: the encoding is reused
        lambda: setattr(info, "step_number", 1),
        lambda: setattr(info, "retry_count", 1),
        lambda: info.states.update(recorder=convert.to_struct({"n": 1})),
        lambda: info.states.update(recorder=convert.to_struct({"n": True})),  # equal as JSON, not sent so
        lambda: setattr(info, "request_context", {"user": "u1", "flag": 1}),
        lambda: info.message_sources.update(a="response"),  # the run's live map, changed in place
    ]
    async with ProcessorServer([recorder]) as server, ProcessorClient(server.addresses[0]) as client:
        handle = wire_handle(client)
        caller = GrpcHookCaller(info, OrchestratorMetrics())
        for change in changes:
            change()
            await caller.call(handle, step(messages))
            state = info.states.get("recorder")
            expected = convert.from_struct(state) if isinstance(state, struct_pb2.Struct) else {}
            sources = tuple(k for k, v in info.message_sources.items() if v == "response")
            assert recorder.seen[-1] == (
                info.step_number,
                info.retry_count,
                expected,
                info.request_context,
                sources,
            )
    assert recorder.seen[4][2] == {"n": True}
    assert recorder.seen[5][3] == {"user": "u1", "flag": 1}


def test_encodings_of_replaced_messages_do_not_pile_up() -> None:
    encodings = MessageEncodings()
    for _ in range(50):
        wire.encode_request(step(conversation()), encodings)  # new dicts every time
    assert len(encodings._by_id) <= 2 * 2 + 64 + 2


def wire_handle(client: ProcessorClient) -> ProcessorHandle:
    hooks, options = frozenset({"process_input"}), struct_pb2.Struct()
    return ProcessorHandle("recorder", "recorder", client, options, hooks, False, 10.0, "fail-closed")
