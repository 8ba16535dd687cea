"""A raw grpc.aio unary echo (P1's baseline): the same bytes back, no SDK in between."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

METHOD = "/bench.Echo/Echo"
STREAM_METHOD = "/bench.Echo/EchoStream"


async def serve(addresses: list[str]) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    async def echo_stream(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "EchoStream": grpc.stream_stream_rpc_method_handler(echo_stream),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    for addr in addresses:
        server.add_insecure_port(addr)
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", action="append", required=True)
    asyncio.run(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()
