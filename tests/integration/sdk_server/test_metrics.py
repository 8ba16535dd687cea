"""ProcessorServer on real sockets: the server counts hook calls by processor, hook and outcome,
and a stream's parts once per batch.
"""

from __future__ import annotations

import grpc
import pytest

from procmesh import ProcessorClient, ProcessorServer, errors
from procmesh.v1 import processor_pb2 as ppb
from tests.integration.sdk_server.support import (
    TIMEOUT,
    delta,
    finish,
    input_request,
    run_context,
    stream_request,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


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


async def test_a_stream_part_whose_hook_raises_is_counted_internal_and_fails_the_stream(
    server: ProcessorServer, client: ProcessorClient
) -> None:
    ok, internal = stream_parts(server, "faulty", "ok"), stream_parts(server, "faulty", "internal")
    call = client.open_stream(TIMEOUT)
    parts = [(1, delta("a")), (2, delta("boom")), (3, delta("c"))]
    await call.write(stream_request(parts, run_context("faulty")))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "processor 'faulty' hook process_output_stream raised RuntimeError: boom"
    assert stream_parts(server, "faulty", "ok") - ok == 1  # the part before it
    assert stream_parts(server, "faulty", "internal") - internal == 1
