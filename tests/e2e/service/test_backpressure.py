"""Backpressure and per-key limits against a real `procmesh-orchestrator` (issue 24, finding 9).

Clients that do not read, or read slowly, pause their own runs (and the model streams behind
them) instead of filling the orchestrator's memory; a client that stops reading for
``PROCMESH_SLOW_CLIENT_SECONDS`` is cut and its run aborted; one API key at its
``PROCMESH_MAX_INFLIGHT_PER_KEY`` gets 429 / RESOURCE_EXHAUSTED while another key is served.
The model is the fake OpenAI-compatible API streaming 100 MB answers as fast as it may.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fake_wire import Event
from tests.integration.providers.fakes import FakeOpenAI, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

KEYS = {"a": "key-a-0123456789", "b": "key-b-0123456789", "c": "key-c-0123456789"}
API_KEYS = ",".join(f"{key}=tenant-{name}" for name, key in KEYS.items())
PER_KEY = 16
DELTA = "x" * 4000 + " "
ANSWER_BYTES = 100 * 1024 * 1024
"""What the model would send for one run if nothing paused it."""
MIB = 1024 * 1024
PROBE_TIMEOUT = 1.0
"""/healthz and another tenant's run must answer within this (httpx raises past it)."""


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


class TorrentModel(FakeOpenAI):
    """The model `big`: a 100 MB streamed answer, written as fast as the socket takes it; `streams`
    records, per request, the bytes its socket accepted and whether the reader went away."""

    def events(self, reply: Reply, body: dict[str, Any]) -> Iterator[Event]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps(
                self._completion_chunk(body, [{"index": 0, "delta": delta, "finish_reason": finish}])
            )

        data = chunk({"content": DELTA})  # encoded once: the flood is as fast as the socket
        for _ in range(ANSWER_BYTES // len(data)):
            yield None, data
        yield None, chunk({}, "stop")
        yield None, "[DONE]"


@pytest.fixture(scope="module")
def torrent() -> Iterator[TorrentModel]:
    model = TorrentModel().start()
    yield model
    model.stop()


def config(torrent: TorrentModel, guards: str | None = None) -> dict[str, Any]:
    agents: dict[str, Any] = {
        "big": {"model": "fake/big", "errorProcessorDefaults": False},
        "small": {"model": "demo", "errorProcessorDefaults": False},
    }
    if guards is not None:  # the model stream through a real sidecar's processOutputStream
        word_filter = {"processor": "guards/word-filter", "options": {"words": ["darn"]}}
        agents["filtered"] = {
            "model": "fake/big",
            "errorProcessorDefaults": False,
            "outputProcessors": [word_filter],
        }
    return {
        "sidecars": {"guards": {"address": guards}} if guards is not None else {},
        "providers": {"fake": {"kind": "openai", "baseUrl": torrent.base_url}},
        "agents": agents,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    torrent: TorrentModel,
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    guards = start_sidecar("examples", name="guards")
    await guards.wait_ready()
    env = {
        "PROCMESH_API_KEYS": API_KEYS,
        "PROCMESH_SLOW_CLIENT_SECONDS": "300",  # nobody is cut here: the pause alone bounds memory
        "PROCMESH_MAX_INFLIGHT_PER_KEY": str(PER_KEY),
    }
    return await asyncio.to_thread(start_orchestrator, config(torrent, guards.address), env=env)


def rss_mib(orchestrator: OrchestratorProcess) -> float:
    with open(f"/proc/{orchestrator.proc.pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def http_port(orchestrator: OrchestratorProcess) -> int:
    return int(orchestrator.http_url.rsplit(":", 1)[1])


def stream_request(key: str, agent: str = "big") -> bytes:
    body = json.dumps({"messages": "go"}).encode()
    head = (
        f"POST /api/agents/{agent}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEYS[key]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def open_stream(orchestrator: OrchestratorProcess, key: str, agent: str = "big") -> socket.socket:
    """A streamed run whose client reads the status line and then nothing more."""
    sock = socket.create_connection(("127.0.0.1", http_port(orchestrator)), timeout=10)
    sock.sendall(stream_request(key, agent))
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


async def metric(orchestrator: OrchestratorProcess, name: str) -> float:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name)]
    return float(values[0]) if values else 0.0


async def test_clients_that_do_not_read_slow_only_their_own_runs(
    orchestrator: OrchestratorProcess, torrent: TorrentModel
) -> None:
    start = rss_mib(orchestrator)
    first = len(torrent.streams)
    silent = [await asyncio.to_thread(open_stream, orchestrator, "a") for _ in range(10)]
    received = [0, 0, 0]

    async def read_slowly(i: int) -> None:  # 4 KiB every 100 ms: 40 KB/s
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port(orchestrator))
        writer.write(stream_request("a"))
        try:
            while data := await reader.read(4096):
                received[i] += len(data)
                await asyncio.sleep(0.1)
        finally:
            writer.close()

    slow = [asyncio.create_task(read_slowly(i)) for i in range(3)]
    peak = start
    probes = 0
    try:
        async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=PROBE_TIMEOUT) as http:
            for _ in range(12):
                assert (await http.get("/healthz")).status_code == 200
                answer = await http.post(
                    "/api/agents/small/generate", json={"messages": "hi"}, headers=auth("b")
                )
                assert answer.status_code == 200, answer.text
                probes += 1
                peak = max(peak, rss_mib(orchestrator))
                assert peak < 300, f"orchestrator RSS {peak:.0f} MiB"
                await asyncio.sleep(1)
        halfway = list(received)
        await asyncio.sleep(2)
        assert all(now > then for now, then in zip(received, halfway, strict=True))  # still reading
    finally:
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        for sock in silent:
            sock.close()
    runs = [stream.sent for stream in torrent.streams[first:]]
    assert len(runs) == 13
    # Paused: each model stream gave what the sockets' buffers hold (some MB), not its 100 MB.
    assert max(runs) < ANSWER_BYTES // 4, [n // MIB for n in runs]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        after = rss_mib(orchestrator)
        inflight = await metric(orchestrator, "procmesh_inflight_runs")
        if inflight == 0 and after < start + 40:
            break
        await asyncio.sleep(0.5)
    assert inflight == 0
    assert after < start + 40, f"RSS {start:.0f} MiB at the start, {peak:.0f} at the peak, {after:.0f} after"
    print(f"RSS: {start:.0f} MiB at the start, peak {peak:.0f} MiB, {after:.0f} MiB after; {probes} probes")


async def test_an_output_stream_processor_between_does_not_unpause_the_model(
    orchestrator: OrchestratorProcess, torrent: TorrentModel
) -> None:
    first = len(torrent.streams)
    sock = await asyncio.to_thread(open_stream, orchestrator, "a", "filtered")
    try:
        deadline = time.monotonic() + 30
        while len(torrent.streams) == first:  # the run asks the model
            assert time.monotonic() < deadline, "the model was never asked"
            await asyncio.sleep(0.1)
        previous = -1
        while (sent := torrent.streams[first].sent) != previous:  # until the model stream stops growing
            assert time.monotonic() < deadline, f"the model stream still grows: {sent // MIB} MiB"
            previous = sent
            await asyncio.sleep(1)
        assert sent < ANSWER_BYTES // 4
    finally:
        sock.close()


async def test_one_key_at_its_limit_gets_429_while_another_key_still_gets_200(
    orchestrator: OrchestratorProcess,
) -> None:
    held = [await asyncio.to_thread(open_stream, orchestrator, "c") for _ in range(PER_KEY)]
    try:
        async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=10) as http:
            refused = await http.post(
                "/api/agents/small/generate", json={"messages": "hi"}, headers=auth("c")
            )
            assert refused.status_code == 429
            assert refused.json() == {
                "error": f"API key key-3 has {PER_KEY} requests in flight, its limit "
                f"(PROCMESH_MAX_INFLIGHT_PER_KEY={PER_KEY}): retry when one has ended"
            }
            other = await http.post("/api/agents/small/generate", json={"messages": "hi"}, headers=auth("b"))
            assert other.status_code == 200
        async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
            stub = agrpc.AgentServiceStub(channel)
            request = apb.StreamRequest(agent_id="small", text="hi")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Stream(request, metadata=(("authorization", f"Bearer {KEYS['c']}"),)):
                    pass
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"PROCMESH_MAX_INFLIGHT_PER_KEY={PER_KEY}" in (info.value.details() or "")
            replies = [
                r async for r in stub.Stream(request, metadata=(("authorization", f"Bearer {KEYS['b']}"),))
            ]
            assert replies[-1].status == "success"
    finally:
        for sock in held:
            sock.close()
    async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=10) as http:
        deadline = time.monotonic() + 20
        while True:  # the slots come back as the orchestrator sees the clients gone
            again = await http.post("/api/agents/small/generate", json={"messages": "hi"}, headers=auth("c"))
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert again.status_code == 200


async def test_a_client_that_stops_reading_is_cut_after_the_deadline(
    torrent: TorrentModel, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    env = {"PROCMESH_API_KEYS": API_KEYS, "PROCMESH_SLOW_CLIENT_SECONDS": "2"}
    orchestrator = await asyncio.to_thread(start_orchestrator, config(torrent), env=env)
    first = len(torrent.streams)
    sock = await asyncio.to_thread(open_stream, orchestrator, "a")
    try:
        deadline = time.monotonic() + 30
        while await metric(orchestrator, 'procmesh_slow_clients_cut_total{api="http"}') < 1:
            assert time.monotonic() < deadline, "the client that does not read was never cut"
            await asyncio.sleep(0.2)
        while await metric(orchestrator, "procmesh_inflight_runs") > 0:  # the run was aborted
            assert time.monotonic() < deadline, "the cut client's run is still in flight"
            await asyncio.sleep(0.2)
        while not torrent.streams[first].cut:  # and the model stream behind it closed
            assert time.monotonic() < deadline, "the cut client's model stream goes on"
            await asyncio.sleep(0.2)

        def drain() -> bytes:
            data = b""
            try:
                while piece := sock.recv(1 << 20):
                    data += piece
            except ConnectionResetError:
                pass
            return data

        assert b"[DONE]" not in await asyncio.to_thread(drain)  # cut, not finished
    finally:
        sock.close()
    assert "connection cut, its run handled as a disconnect" in orchestrator.log()
    assert torrent.streams[first].sent < ANSWER_BYTES // 4
