"""A real grpc.aio server on 127.0.0.1 playing the model gateway for the SDK's side of ModelService
(`procmesh._model` configured to it while it serves); the servicer records what it is sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

import grpc

from procmesh import _model
from procmesh.v1 import model_pb2_grpc as mgrpc

S = TypeVar("S", bound=mgrpc.ModelServiceServicer)


async def serve_gateway(servicer: S) -> AsyncIterator[S]:
    """Serve `servicer` and point the SDK's gateway client at it until the fixture ends."""
    server = grpc.aio.server()
    mgrpc.add_ModelServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _model.configure(f"127.0.0.1:{port}")
    try:
        yield servicer
    finally:
        _model.configure(None)
        await server.stop(None)
