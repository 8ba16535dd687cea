"""Helpers for testing processors over real gRPC, as the orchestrator calls them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from procmesh._client import ProcessorClient
from procmesh._processor import Processor
from procmesh._server import ProcessorServer
from procmesh._tool import Tool

__all__ = ["serve_for_test"]


@contextlib.asynccontextmanager
async def serve_for_test(
    processors: Sequence[Processor], address: str = "127.0.0.1:0", *, tools: Sequence[Tool] = ()
) -> AsyncIterator[ProcessorClient]:
    """Serve `processors` and `tools` on `address` (a free TCP port by default); yield a client."""
    async with ProcessorServer(processors, [address], tools=tools) as server:
        client = ProcessorClient(server.addresses[0])
        try:
            yield client
        finally:
            await client.close()
