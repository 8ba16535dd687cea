"""Fused requests and rewinds answered alike by the Python and the Node SDK, in real processes.

fusion_twins.py (Python SDK) and fusion_twins.mjs (Node SDK) serve the same processors, each in
its own process, started once for this module. Every case sends the identical request to both
and checks the answers against what the contract says (proto/README.md, "Speculative
processors" and "Fused processors"), then against each other. Signal ids and times are made
fresh by each sidecar, and error details are each SDK's own words, so those are normalised
before the two answers are compared.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.node.conftest import HERE, node_sidecar, require_node

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    body: Any


@dataclass
class Twins:
    python: Any
    node: Any


@pytest.fixture(scope="module")
def processes(socket_dir: Path) -> Iterator[tuple[str, str]]:
    require_node()
    py = SidecarProcess(
        [],
        f"unix://{socket_dir / 'fuse-py.sock'}",
        log_path=str(socket_dir / "fuse-py.log"),
        module="tests.e2e.node.fusion_twins",
    )
    py.start()
    node = node_sidecar(
        HERE / "fusion_twins.mjs", f"unix://{socket_dir / 'fuse-node.sock'}", socket_dir / "fuse-node.log"
    )
    try:
        yield py.address, node.address
    finally:
        py.stop(grace=2.0)
        node.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def twins(processes: tuple[str, str]) -> AsyncIterator[Twins]:
    py_address, node_address = processes
    for address in processes:
        await SidecarProcess([], address).wait_ready()
    async with grpc.aio.insecure_channel(py_address) as py, grpc.aio.insecure_channel(node_address) as node:
        yield Twins(pgrpc.ProcessorServiceStub(py), pgrpc.ProcessorServiceStub(node))


# -- requests and answers --------------------------------------------------------------------------


def context(
    pid: str, *fused: str, state: dict[str, Any] | None = None, announce: bool = False
) -> tpb.RunContext:
    ctx = tpb.RunContext(processor_id=pid, run_id="run-1", agent_id="agent-1", announce_signals=announce)
    ctx.state.CopyFrom(convert.to_struct(state or {"from": pid}))
    for i, member in enumerate(fused):
        ctx.fused.add(processor_id=member, state=convert.to_struct({"from": f"{member}-{i}"}))
    return ctx


def input_request(ctx: tpb.RunContext, text: str) -> ppb.ProcessInputRequest:
    req = ppb.ProcessInputRequest(context=ctx)
    message = {
        "id": "m1",
        "role": "user",
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }
    convert.message_to_proto(message, req.messages.add())
    return req


def delta(text: str) -> tpb.Chunk:
    return convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": text}})


def batch(start: int, *chunks: tpb.Chunk, **fields: Any) -> ppb.ProcessOutputStreamRequest:
    req = ppb.ProcessOutputStreamRequest(**fields)
    for i, chunk in enumerate(chunks):
        req.parts.add(seq=start + i, part=chunk)
    return req


def normalised(value: Any) -> Any:
    """Fresh ids and times as placeholders; an error detail as its status code name only."""
    if isinstance(value, dict):
        return {
            k: ("<error>" if k == "error" and isinstance(v, str) else normalised(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, str):
        return _TIME.sub("<time>", _UUID.sub("<id>", value))
    return value


def as_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


async def unary(stub: Any, request: Any, rpc: str = "ProcessInput") -> Answer:
    try:
        return Answer(grpc.StatusCode.OK, as_dict(await getattr(stub, rpc)(request, timeout=5)))
    except grpc.aio.AioRpcError as exc:
        return Answer(exc.code(), exc.details())


async def stream(stub: Any, requests: list[ppb.ProcessOutputStreamRequest]) -> Answer:
    """Each request answered before the next is sent (as the orchestrator's rewinds come)."""
    call = stub.ProcessOutputStream(timeout=5)
    out: list[dict[str, Any]] = []
    try:
        for req in requests:
            await call.write(req)
            resp = await call.read()
            out.append(as_dict(resp))
            if any("abort" in r.get("effects", {}) for r in out[-1].get("results", [])):
                break
        await call.done_writing()
        while (resp := await call.read()) is not grpc.aio.EOF:
            out.append(as_dict(resp))
    except grpc.aio.AioRpcError as exc:
        return Answer(exc.code(), out)
    return Answer(grpc.StatusCode.OK, out)


async def alike(twins: Twins, call: Any, *args: Any) -> Answer:
    """Both SDKs' answers, which must agree (normalised); the Python one is returned."""
    py, node = await call(twins.python, *args), await call(twins.node, *args)
    assert py.code == node.code, (py, node)
    if not isinstance(py.body, str):  # a status detail is each SDK's own words
        assert normalised(py.body) == normalised(node.body)
    return py


async def drain(call: Any) -> None:
    """Read a stream to its end (its status raises)."""
    while await call.read() is not grpc.aio.EOF:
        pass


def texts(results: list[dict[str, Any]]) -> list[list[str]]:
    """Each result's chunks as short strings: a text delta's text, or a data chunk's type."""
    out = []
    for res in results:
        chunks = ([res["part"]] if "part" in res else []) + res.get("extra_parts", [])
        out.append([c["text_delta"]["text"] if c["type"] == "text-delta" else c["type"] for c in chunks])
    return out


def state(struct: dict[str, Any]) -> dict[str, Any]:
    return {k: int(v) if isinstance(v, float) else v for k, v in struct.items()}


# -- Describe ------------------------------------------------------------------------------------


async def test_both_sdks_declare_fusing_and_which_processors_are_speculative(twins: Twins) -> None:
    for stub in (twins.python, twins.node):
        described = await stub.Describe(ppb.DescribeRequest(), timeout=5)
        assert described.fuses
        assert {p.id: p.speculative for p in described.processors} == {
            "tally": True,
            "shout": True,
            "plain": False,
        }


# -- unary -----------------------------------------------------------------------------------------


async def test_a_fused_call_runs_every_processor_while_each_passes_its_input_on(twins: Twins) -> None:
    answer = await alike(twins, unary, input_request(context("tally", "shout", "plain"), "hello emit"))
    body = answer.body
    assert "messages" not in body  # nobody rewrote
    assert state(body["effects"]["state"]) == {"from": "tally", "calls": 1}
    assert body["effects"]["custom_chunks"] == [
        {"type": "data-tally", "data": {"calls": 1.0}}
    ]  # does not stop it
    assert [state(o["effects"]["state"]) for o in body["effects"]["fused"]] == [
        {"from": "shout-0", "seen": 1},
        {"from": "plain-1", "calls": 1},
    ]


@pytest.mark.parametrize(
    ("text", "stopped_by"),
    [("rewrite", "result"), ("signal", "signal"), ("stop", "abort"), ("boom", "error")],
)
async def test_the_chain_stops_at_the_first_processor_that_changes_anything(
    twins: Twins, text: str, stopped_by: str
) -> None:
    answer = await alike(twins, unary, input_request(context("tally", "shout", "plain"), text))
    body = answer.body
    fused = body["effects"]["fused"]
    assert len(fused) == 1  # plain, after shout, did not run
    outcome = fused[0]
    if stopped_by == "result":
        assert body["replace_messages"]
        assert body["messages"][0]["content"]["parts"][0]["text"]["text"] == "REWRITTEN"
    elif stopped_by == "signal":
        assert outcome["effects"]["signals"][0]["contents"] == "heard you"
    elif stopped_by == "abort":
        assert outcome["effects"]["abort"]["reason"] == "shout stops here"
    else:
        assert outcome["error"].startswith("INTERNAL: ")
        assert "shout exploded" in outcome["error"]
        assert "effects" not in outcome


async def test_a_fused_call_answers_what_separate_calls_answer(twins: Twins) -> None:
    for stub in (twins.python, twins.node):
        for text in ("hello", "rewrite", "signal", "stop"):
            fused = await unary(stub, input_request(context("tally", "shout"), text))
            first = await unary(stub, input_request(context("tally"), text))
            second_ctx = tpb.RunContext(processor_id="shout", run_id="run-1", agent_id="agent-1")
            second_ctx.state.CopyFrom(convert.to_struct({"from": "shout-0"}))
            second = await unary(stub, input_request(second_ctx, text))
            expected = {k: v for k, v in second.body.items() if k != "effects"}
            expected["effects"] = {**first.body["effects"], "fused": [{"effects": second.body["effects"]}]}
            assert fused.body == expected, text


async def test_a_fused_request_naming_an_unknown_processor_runs_nothing(twins: Twins) -> None:
    answer = await alike(twins, unary, input_request(context("tally", "shout", "nope"), "hello"))
    assert answer.code == grpc.StatusCode.NOT_FOUND
    req = ppb.ExecuteToolRequest(context=context("tally", "shout"), tool_name="t")
    answer = await alike(twins, unary, req, "ExecuteTool")
    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT


# -- fused stream ------------------------------------------------------------------------------------


@pytest.mark.parametrize("announce", [False, True])
async def test_a_fused_stream_runs_each_part_through_every_processor(twins: Twins, announce: bool) -> None:
    data = convert.chunk_to_proto({"type": "data-note", "data": {"k": 1}})
    requests = [
        batch(
            1,
            delta("a b"),
            delta("emit"),
            data,
            context=context("tally", "shout", "plain", announce=announce),
        ),
        batch(4, delta("sig x"), delta("split me"), delta("drop")),
        batch(7, delta("boom"), delta("after")),
    ]
    answer = await alike(twins, stream, requests)
    assert answer.code == grpc.StatusCode.OK
    results = [r for resp in answer.body for r in resp.get("results", [])]
    assert [r["seq"] for r in results] == [str(i) for i in range(1, 9)]
    signal_chunks = ["data-signal"] if announce else []
    assert texts(results) == [
        ["A B#1/1"],
        ["data-tally", "EMIT#2/2"],  # tally's custom chunk goes on through shout (which passes data parts on)
        ["data-note"],  # tally rewrote the data part; shout and plain do not take data parts
        [*signal_chunks, "SIG X#4/4"],
        ["split", "me#5/5"],  # shout split it (unchanged words), plain took both
        [],  # dropped by shout
        ["boom#7/7"],  # shout failed: from here on it passes parts through unchanged
        ["after#8/8"],
    ]
    assert results[2]["part"]["data"] == {"seen": {"k": 1.0}, "n": 3.0}
    shout = [r["effects"]["fused"][0] for r in results]
    assert [bool(o.get("error")) for o in shout] == [False] * 6 + [True, False]  # the error is set once
    assert shout[6]["error"].startswith("INTERNAL: ")
    assert shout[3]["effects"]["signals"][0]["contents"] == "saw sig x#4/4"
    if announce:  # the chunk and the signal carry the same id, as the orchestrator's record would
        assert results[3]["part"]["data"]["id"] == shout[3]["effects"]["signals"][0]["id"]
        assert results[3]["part"]["data"]["tagName"] == "notification"
    end = answer.body[-1]["end"]
    assert state(end["state"]) == {"from": "tally", "n": 8}
    assert [state(s) for s in end["fused_states"]] == [
        {"from": "shout-0", "n": 6},
        {"from": "plain-1", "n": 7},
    ]


async def test_an_abort_in_a_fused_stream_ends_it_after_the_later_processors_saw_what_came_before(
    twins: Twins,
) -> None:
    requests = [
        batch(1, delta("one"), delta("split stop"), delta("never"), context=context("shout", "tally"))
    ]
    answer = await alike(twins, stream, requests)
    results = answer.body[0]["results"]
    assert [r["seq"] for r in results] == ["1", "2"]  # nothing after the aborting part
    assert results[1]["effects"]["abort"]["reason"] == "shout stops the stream"
    assert "part" not in results[1]
    assert state(answer.body[-1]["end"]["fused_states"][0]) == {"from": "tally-0", "n": 1}


# -- rewinds ------------------------------------------------------------------------------------


async def test_a_rewind_puts_the_state_back_and_the_replacements_follow(twins: Twins) -> None:
    requests = [
        batch(1, delta("a"), delta("b"), context=context("tally")),
        batch(3, delta("c")),
        batch(4, delta("B"), delta("C"), rewind_to=2),  # withdraws seq 2 and 3, mid-batch
        batch(6, committed_through=4),
        batch(6, delta("D")),
    ]
    answer = await alike(twins, stream, requests)
    assert answer.code == grpc.StatusCode.OK
    assert [texts(resp.get("results", [])) for resp in answer.body[:-1]] == [
        [["a#1/1"], ["b#2/2"]],
        [["c#3/3"]],
        [["B#2/2"], ["C#3/3"]],  # counted from the state before seq 2, stream_parts cut back too
        [],
        [["D#4/4"]],
    ]
    assert state(answer.body[-1]["end"]["state"]) == {"from": "tally", "n": 4}


async def test_a_fused_speculative_stream_rewinds_every_processor(twins: Twins) -> None:
    requests = [
        batch(1, delta("x"), delta("sig y"), context=context("tally", "shout")),
        batch(3, delta("z")),
        batch(4, delta("y2"), delta("z2"), rewind_to=2),
    ]
    answer = await alike(twins, stream, requests)
    assert texts(answer.body[2]["results"]) == [["Y2#2/2"], ["Z2#3/3"]]
    assert "signals" not in answer.body[2]["results"][0]["effects"]["fused"][0].get("effects", {})
    end = answer.body[-1]["end"]
    assert state(end["state"])["n"] == 3
    assert state(end["fused_states"][0])["n"] == 3


@pytest.mark.parametrize(
    ("ctx", "field"),
    [
        (context("plain"), "rewind_to"),
        (context("tally", "plain"), "rewind_to"),
        (context("plain"), "committed_through"),
    ],
)
async def test_a_stream_that_is_not_all_speculative_refuses_rewinds_naming_the_field(
    twins: Twins, ctx: tpb.RunContext, field: str
) -> None:
    requests = [batch(1, delta("a"), context=ctx), batch(2, delta("b"), **{field: 1})]
    answer = await alike(twins, stream, requests)
    assert answer.code == grpc.StatusCode.FAILED_PRECONDITION
    for stub in (twins.python, twins.node):
        call = stub.ProcessOutputStream(timeout=5)
        for req in requests:
            await call.write(req)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await drain(call)
        details = info.value.details() or ""
        assert field in details
        assert "plain" in details


async def test_a_rewind_below_what_was_committed_is_invalid(twins: Twins) -> None:
    requests = [
        batch(1, delta("a"), delta("b"), context=context("tally")),
        batch(3, committed_through=2),
        batch(3, rewind_to=1),
    ]
    answer = await alike(twins, stream, requests)
    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT
