"""ProcessorServer on real sockets: ProcessOutputStream end to end (parts answered in order within
and across requests, dropped, aborted, data parts, custom chunks, failures and a bad first
request).
"""

from __future__ import annotations

import grpc
import pytest

from procmesh import ProcessorClient, convert
from procmesh.v1 import types_pb2 as tpb
from tests.integration.sdk_server.support import (
    TIMEOUT,
    TRANSPORTS,
    delta,
    finish,
    result_chunks,
    rpc_error,
    run_context,
    stream_request,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
