"""The Node SDK behaves like the Python SDK: same requests, same answers.

The processors of parity_twins.py are served by the Python SDK in this process; their twins in
tests/e2e/node/contract.mjs are served by the Node SDK in a real Node process. Each case sends
the identical request to both and compares the responses field by field (or the status codes).
The `echo` processor records everything its hooks are handed into its state and returns it
unchanged, so the comparison also covers how each SDK decodes requests (every message part and
chunk kind, the run context) and encodes results. The requests and the calls that send them to
both are parity_requests.py's.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh import SERVICE_NAME, ProcessorServer, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.conftest import HERE, NODE_SDK, Sidecars, node_sidecar, wait_all
from tests.e2e.node.parity_requests import (
    CHUNKS,
    RICH,
    UNARY,
    Pair,
    as_dict,
    assert_same,
    bare_request,
    context,
    messages,
    rich_request,
    stream_answers,
    stream_request,
)
from tests.e2e.node.parity_twins import Echo, Effects, Faulty, Strict
from tests.fixtures.censor import Censor, DataCensor

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SETUP_DELAY = 5.0
"""How long contract.mjs's slow setup() takes: long enough that a Node process started on a busy
2-core machine (1-3 s to load its modules) still answers Describe before it ends."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node_contract(sidecars: Sidecars) -> AsyncIterator[tuple[Any, str, float]]:
    """contract.mjs in a Node process with a slow setup(); not waited for (the first test watches it)."""
    address = f"unix://{sidecars.dir / 'contract.sock'}"
    os.environ["SETUP_DELAY_MS"] = str(int(SETUP_DELAY * 1000))
    try:
        proc = node_sidecar(HERE / "contract.mjs", address, sidecars.dir / "contract.log")
    finally:
        del os.environ["SETUP_DELAY_MS"]
    started = time.monotonic()
    yield proc, address, started
    proc.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(node_contract: tuple[Any, str, float]) -> AsyncIterator[Pair]:
    proc, address, _ = node_contract
    await proc.wait_ready()
    server = ProcessorServer([Echo(), Effects(), Censor(), DataCensor(), Faulty(), Strict()], ["127.0.0.1:0"])
    await server.start()
    py_channel = grpc.aio.insecure_channel(server.addresses[0])
    node_channel = grpc.aio.insecure_channel(address)
    yield Pair(
        pgrpc.ProcessorServiceStub(py_channel), pgrpc.ProcessorServiceStub(node_channel), proc, address
    )
    await py_channel.close()
    await node_channel.close()
    await server.stop(grace=0.5)


# -- lifecycle --------------------------------------------------------------------------------------


async def test_describe_answers_at_once_but_hooks_and_health_wait_for_setup(
    node_contract: tuple[Any, str, float],
) -> None:
    proc, address, started = node_contract
    fast_reconnect = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50)]
    async with grpc.aio.insecure_channel(address, options=fast_reconnect) as channel:
        stub = pgrpc.ProcessorServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                described = await stub.Describe(ppb.DescribeRequest(), timeout=0.5)
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() - started < 10, "the Node sidecar never answered Describe"
                await asyncio.sleep(0.02)
        # Health still NOT_SERVING (below) is what shows that Describe answered before setup()
        # finished; the clock is not asserted (it depends on the machine's load).
        assert described.sdk.startswith("procmesh-node/")
        for service in ("", SERVICE_NAME):
            status = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ProcessInput(ppb.ProcessInputRequest(context=context("slow")), timeout=1)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        await proc.wait_ready()
        assert time.monotonic() - started >= SETUP_DELAY
        await stub.ProcessInput(ppb.ProcessInputRequest(context=context("slow")), timeout=1)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=1)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_describe_lists_what_the_python_sdk_lists(servers: Pair) -> None:
    py = as_dict(await servers.python.Describe(ppb.DescribeRequest(), timeout=5))
    node = as_dict(await servers.node.Describe(ppb.DescribeRequest(), timeout=5))
    assert node["sdk"].startswith("procmesh-node/")
    py_infos = {p["id"]: p for p in py["processors"]}
    node_infos = {p["id"]: p for p in node["processors"] if p["id"] != "slow"}
    assert set(node_infos) == set(py_infos)
    for pid, info in py_infos.items():
        other = node_infos[pid]
        assert other["hooks"] == info["hooks"], pid
        assert other.get("process_data_parts", False) == info.get("process_data_parts", False), pid
        assert other["name"] == info["name"]
    assert "options_schema_json" in node_infos["strict"]


async def test_the_unix_socket_is_group_accessible_only(servers: Pair) -> None:
    path = servers.node_address[len("unix://") :]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


# -- decoding and encoding: the echo processor -------------------------------------------------------


@pytest.mark.parametrize("hook", UNARY)
async def test_every_request_field_reaches_the_hook_and_comes_back_alike(servers: Pair, hook: str) -> None:
    node = await assert_same(servers, hook, rich_request(hook, context("echo")))
    assert node.code == grpc.StatusCode.OK
    seen = convert.from_struct(json_format.ParseDict(node.body["effects"]["state"], tpb.RunContext().state))
    assert seen["prev"] == {"x": [1, "y"]}  # the state sent, kept
    assert seen["seen"]  # the hook recorded what it was handed


@pytest.mark.parametrize("hook", UNARY)
async def test_a_bare_request_gives_the_same_defaults(servers: Pair, hook: str) -> None:
    await assert_same(servers, hook, bare_request(hook, context("echo", full=False)))


async def test_the_echoed_messages_round_trip_unchanged(servers: Pair) -> None:
    node = await assert_same(servers, "ProcessOutputStep", rich_request("ProcessOutputStep", context("echo")))
    back = [
        convert.message_from_proto(json_format.ParseDict(m, tpb.Message())) for m in node.body["messages"]
    ]
    assert back == [convert.message_from_proto(m) for m in messages(*RICH)]
    assert node.body["replace_messages"] is True


async def test_stream_parts_of_every_kind_reach_the_hook_alike(servers: Pair) -> None:
    requests = [stream_request("echo", *CHUNKS[:4]), stream_request(None, *CHUNKS[4:], start=5)]
    py_code, py = await stream_answers(servers.python, requests)
    node_code, node = await stream_answers(servers.node, requests)
    assert (py_code, node_code) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
    assert node == py
    assert [int(r["seq"]) for resp in node for r in resp.get("results", [])] == list(
        range(1, len(CHUNKS) + 1)
    )
    assert "end" in node[-1]


# -- results and effects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "text"),
    [
        ("ProcessInput", ""),
        ("ProcessInputStep", ""),
        ("ProcessLLMRequest", ""),
        ("ProcessLLMResponse", ""),
        ("ProcessOutputStep", "forbidden"),
        ("ProcessOutputStep", "default"),
        ("ProcessOutputStep", "thrown"),
        ("ProcessOutputStep", "fine"),
        ("ProcessOutputResult", ""),
        ("ProcessAPIError", ""),
        ("ProcessToolResult", "secrets"),
        ("ProcessToolResult", "weather"),
    ],
)
async def test_results_signals_chunks_violations_and_aborts_are_encoded_alike(
    servers: Pair, hook: str, text: str
) -> None:
    req = rich_request(hook, context("effects", state={"history": [1]}))
    if hook == "ProcessOutputStep":
        req.text = text
    if hook == "ProcessToolResult":
        req.tool_name = text
    node = await assert_same(servers, hook, req)
    assert node.code == grpc.StatusCode.OK
    if text == "default":
        assert node.body["effects"]["abort"] == {"reason": "Tripwire triggered by effects"}
    if text == "forbidden":
        abort = node.body["effects"]["abort"]
        assert abort["retry"] is True
        assert abort["metadata"] == {"word": "forbidden", "score": 0.9}


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({}, grpc.StatusCode.OK),
        ({"mode": "b", "limit": 7}, grpc.StatusCode.OK),
        ({"mode": "c"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"limit": [1]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"typo": 1}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_options_are_validated_alike(
    servers: Pair, options: dict[str, Any], code: grpc.StatusCode
) -> None:
    req = ppb.ProcessInputRequest(context=context("strict", options=options))
    node = await assert_same(servers, "ProcessInput", req)
    assert node.code == code, node.body
    if code != grpc.StatusCode.OK:
        assert "invalid options for processor 'strict'" in node.body


# -- errors ------------------------------------------------------------------------------------------

ERRORS: list[tuple[str, str, Callable[[str], tpb.RunContext], grpc.StatusCode, str]] = [
    (
        "ProcessInput",
        "missing id",
        lambda h: context(""),
        grpc.StatusCode.INVALID_ARGUMENT,
        "processor_id is required",
    ),
    (
        "ProcessInput",
        "unknown",
        lambda h: context("ghost"),
        grpc.StatusCode.NOT_FOUND,
        "'ghost' is not hosted here",
    ),
    (
        "ProcessInputStep",
        "unimplemented",
        lambda h: context("strict"),
        grpc.StatusCode.UNIMPLEMENTED,
        "'strict'",
    ),
    (
        "ProcessInput",
        "raises",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processor 'faulty' hook processInput raised Error: boom",
    ),
    (
        "ProcessInputStep",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processInputStep returned",
    ),
    (
        "ProcessOutputStep",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processOutputStep returned",
    ),
    (
        "ProcessOutputResult",
        "non-JSON state",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "cannot be sent",
    ),
    (
        "ProcessToolResult",
        "bad signal",
        lambda h: context("faulty"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown signal type",
    ),
    (
        "ProcessLLMRequest",
        "bad custom chunk",
        lambda h: context("faulty"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "must start with 'data-'",
    ),
    ("ProcessLLMResponse", "return ignored", lambda h: context("faulty"), grpc.StatusCode.OK, ""),
    (
        "ProcessAPIError",
        "bad return",
        lambda h: context("faulty"),
        grpc.StatusCode.INTERNAL,
        "processAPIError returned",
    ),
]


@pytest.mark.parametrize(
    ("hook", "what", "ctx", "code", "says"), ERRORS, ids=[f"{e[0]}-{e[1]}" for e in ERRORS]
)
async def test_errors_get_the_same_status_codes(
    servers: Pair,
    hook: str,
    what: str,
    ctx: Callable[[str], tpb.RunContext],
    code: grpc.StatusCode,
    says: str,
) -> None:
    node = await assert_same(servers, hook, rich_request(hook, ctx(hook)))
    assert node.code == code, node.body
    if code != grpc.StatusCode.OK:
        assert says in node.body


@pytest.mark.parametrize("hook", [h for h in UNARY if h not in ("ProcessLLMRequest", "ProcessLLMResponse")])
async def test_a_message_part_of_an_unknown_kind_passes_through_untouched(servers: Pair, hook: str) -> None:
    # A newer orchestrator's part kind (field 15 of Part's oneof, unknown to this release) and a
    # part with nothing set: both SDKs answer OK, show them to the hook, and echo returns them
    # byte for byte (proto/README.md, forward compatibility).
    req = rich_request(hook, context("echo"))
    req.messages[0].content.parts.add().MergeFromString(b"\x7a\x06\x0a\x04soon")
    req.messages[0].content.parts.add()
    sent = [p.SerializeToString() for p in req.messages[0].content.parts]
    await assert_same(servers, hook, req)
    for stub in (servers.python, servers.node):
        resp = await getattr(stub, hook)(req, timeout=5)
        returned = [m for name in ("messages", "all_messages") for m in getattr(resp, name, ())]
        echoed = [m for m in returned if m.id == req.messages[0].id]
        if hook in ("ProcessInput", "ProcessOutputStep", "ProcessOutputResult"):
            assert echoed, resp  # echo returns its messages: the parts must be there as sent
        for msg in echoed:
            # the two new parts byte for byte; the known ones as messages (a Struct's map may be
            # serialized in another key order by another runtime, and is the same message)
            assert [p.SerializeToString() for p in msg.content.parts[-2:]] == sent[-2:]
            assert list(msg.content.parts[:-2]) == list(req.messages[0].content.parts[:-2])


# -- the output stream --------------------------------------------------------------------------------

STREAMS = {
    "keep-replace-drop-emit": ("censor", [["a", "up:loud"], ["drop", "emit"], ["z"]]),
    "abort-midway": ("censor", [["a", "stop", "never"], ["after"]]),
    "data-parts-pass-by": ("censor", [["a", {"type": "data-x", "data": {"k": 1}}, "b"]]),
    "data-parts-handed-over": ("data-censor", [[{"type": "data-x", "data": {"k": 1}}, "b"]]),
    "no-parts": ("censor", [[]]),
}


@pytest.mark.parametrize("unchanged", [False, True], ids=["in-full", "unchanged-runs"])
@pytest.mark.parametrize("case", list(STREAMS))
async def test_streams_are_answered_alike(servers: Pair, case: str, unchanged: bool) -> None:
    pid, batches = STREAMS[case]
    requests, seq = [], 1
    for i, batch in enumerate(batches):
        requests.append(stream_request(pid if i == 0 else None, *batch, start=seq))
        seq += len(batch)
    requests[0].unchanged_results = unchanged  # runs of parts given back unchanged: one result each
    py_code, py = await stream_answers(servers.python, requests)
    node_code, node = await stream_answers(servers.node, requests)
    assert node_code == py_code == grpc.StatusCode.OK
    assert node == py
    assert "end" in node[-1]
    runs = [r for resp in node for r in resp.get("results", []) if "unchanged_through" in r]
    assert bool(runs) == (unchanged and case != "no-parts"), node
    if case == "abort-midway":
        results = [r for resp in node for r in resp.get("results", [])]
        assert [int(r["seq"]) for r in results] == [1, 2]
        assert results[-1]["effects"]["abort"]["reason"] == "stop word"


async def test_a_fused_stream_of_pass_throughs_is_answered_in_runs_alike(servers: Pair) -> None:
    first = stream_request("echo", "a", "b", {"type": "data-x", "data": {"k": 1}}, "c")
    first.context.fused.add(processor_id="echo")
    first.unchanged_results = True
    py_code, py = await stream_answers(servers.python, [first, stream_request(None, "d", start=5)])
    node_code, node = await stream_answers(servers.node, [first, stream_request(None, "d", start=5)])
    assert node_code == py_code == grpc.StatusCode.OK
    assert node == py
    results = [r for resp in node for r in resp.get("results", [])]
    # echo takes data parts: the data part (no text delta) is answered in full and splits the run
    assert [(r["seq"], r.get("unchanged_through")) for r in results] == [
        ("1", "2"),
        ("3", None),
        ("4", "4"),
        ("5", "5"),
    ]


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (stream_request("", "a"), grpc.StatusCode.INVALID_ARGUMENT),
        (stream_request("ghost", "a"), grpc.StatusCode.NOT_FOUND),
        (stream_request("strict", "a"), grpc.StatusCode.UNIMPLEMENTED),
        (stream_request("censor", "boom"), grpc.StatusCode.INTERNAL),
        (stream_request("censor", "bad"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_stream_failures_get_the_same_status_codes(
    servers: Pair, first: ppb.ProcessOutputStreamRequest, code: grpc.StatusCode
) -> None:
    py_code, _ = await stream_answers(servers.python, [first])
    node_code, _ = await stream_answers(servers.node, [first])
    assert node_code == py_code == code


async def test_the_stream_hook_is_handed_the_documented_arguments(servers: Pair) -> None:
    _, node = await stream_answers(servers.node, [stream_request("echo", "x")])
    _, py = await stream_answers(servers.python, [stream_request("echo", "x")])
    state = node[-1]["end"]["state"]
    (seen,) = state["seen"]["processOutputStream"]
    (py_seen,) = py[-1]["end"]["state"]["seen"]["processOutputStream"]
    assert seen["onFailure"] == py_seen["onFailure"] == "fail-open"  # RunContext.on_failure
    assert sorted(seen) == sorted(
        [
            "agentId",
            "onFailure",
            "options",
            "part",
            "requestContext",
            "resourceId",
            "retryCount",
            "runId",
            "stepNumber",
            "streamParts",
            "threadId",
        ]
    )


# -- stopping ---------------------------------------------------------------------------------------


def socket_exists(path: str) -> bool:
    return os.path.exists(path)


@pytest.fixture
def examples_process(sidecars: Sidecars) -> Iterator[Any]:
    proc = node_sidecar(
        NODE_SDK / "examples" / "serve.mjs", f"unix://{sidecars.dir / 'stop.sock'}", sidecars.dir / "stop.log"
    )
    wait_all([proc])
    yield proc
    proc.stop(grace=1.0)


async def test_sigterm_drains_and_removes_the_socket(examples_process: Any) -> None:
    path = examples_process.address[len("unix://") :]
    assert socket_exists(path)
    assert examples_process.stop(grace=5.0) == 0
    assert not socket_exists(path)
