"""The ProcessorServer each module of these tests calls: on TCP port 0 and a unix socket, hosting
support.processors(), with a ProcessorClient and a plain channel per transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from procmesh import ProcessorClient, ProcessorServer
from tests.integration.sdk_server.support import processors


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(sidecar_dir: Path) -> AsyncIterator[ProcessorServer]:
    addresses = ["127.0.0.1:0", f"unix://{sidecar_dir / 'sdk.sock'}"]
    async with ProcessorServer(processors(), addresses) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(server: ProcessorServer) -> AsyncIterator[dict[str, ProcessorClient]]:
    tcp, unix = server.addresses
    out = {"tcp": ProcessorClient(tcp), "unix": ProcessorClient(unix)}
    yield out
    for c in out.values():
        await c.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channels(server: ProcessorServer) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    tcp, unix = server.addresses
    out = {"tcp": grpc.aio.insecure_channel(tcp), "unix": grpc.aio.insecure_channel(unix)}
    yield out
    for c in out.values():
        await c.close()


@pytest.fixture
def client(clients: dict[str, ProcessorClient]) -> ProcessorClient:
    return clients["tcp"]
