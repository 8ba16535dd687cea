"""run(): serve processors until SIGTERM/SIGINT, then drain gracefully."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

from pydantic_settings import BaseSettings, SettingsConfigDict

from procmesh._processor import Processor
from procmesh._server import ProcessorServer, server_credentials


class ProcessorSettings(BaseSettings):
    """Sidecar settings from the environment (``PROCMESH_`` prefix) and the command line."""

    model_config = SettingsConfigDict(env_prefix="PROCMESH_", frozen=True, use_attribute_docstrings=True)

    listen: list[str] = ["127.0.0.1:50051"]
    """Addresses to serve on: ``host:port`` or ``unix:///path.sock`` (JSON list in the env)."""
    metrics_port: int | None = None
    """Port of the Prometheus metrics endpoint (unset: no endpoint)."""
    metrics_host: str | None = None
    """Host the metrics endpoint binds (unset: where gRPC binds; loopback for unix sockets only)."""
    hook_threads: bool = True
    """Run each processor's hooks on its own thread and loop, off the server's (false: inline)."""
    grace_seconds: float = 10.0
    """How long in-flight calls may run after SIGTERM."""
    log_level: str = "INFO"
    """Logging level."""
    tls_cert: str | None = None
    """PEM certificate to serve TLS with (plaintext when unset)."""
    tls_key: str | None = None
    """PEM key of `tls_cert`."""
    tls_client_ca: str | None = None
    """PEM CA that client certificates must chain to (enables mTLS)."""
    parent_pid: int | None = None
    """Exit when this process is no longer our parent (a sidecar started by an orchestrator)."""


def settings_from_args(argv: Sequence[str] | None = None) -> ProcessorSettings:
    """Settings from the environment, overridden by flags (``--listen``, ``--metrics-port``, ...)."""
    parser = argparse.ArgumentParser(description="Serve procmesh processors over gRPC.")
    parser.add_argument("--listen", action="append", help="address (repeatable): host:port or unix:///path")
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--metrics-host")
    parser.add_argument("--grace-seconds", type=float)
    parser.add_argument("--log-level")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--tls-client-ca")
    args, _ = parser.parse_known_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    return ProcessorSettings(**overrides)


async def serve(processors: Sequence[Processor], settings: ProcessorSettings) -> None:
    """Serve until SIGTERM or SIGINT, then stop within the grace period."""
    credentials = None
    if settings.tls_cert or settings.tls_key:
        if not (settings.tls_cert and settings.tls_key):
            raise SystemExit("TLS needs both --tls-cert and --tls-key")
        credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    server = ProcessorServer(
        processors,
        settings.listen,
        metrics_port=settings.metrics_port,
        metrics_host=settings.metrics_host,
        credentials=credentials,
        hook_threads=settings.hook_threads,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    watch = asyncio.create_task(_watch_parent(settings.parent_pid, stop)) if settings.parent_pid else None
    try:
        await stop.wait()
    finally:
        if watch is not None:
            watch.cancel()
        await server.stop(settings.grace_seconds)


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the parent is gone (it may have been killed without stopping us)."""
    while os.getppid() == parent_pid:  # noqa: ASYNC110 - no event exists for "parent died"; poll
        await asyncio.sleep(0.5)
    logging.getLogger(__name__).warning("parent process %d is gone; stopping", parent_pid)
    stop.set()


def run(processors: Sequence[Processor], settings: ProcessorSettings | None = None) -> None:
    """Serve processors in this process until SIGTERM/SIGINT (a sidecar's ``main()``)."""
    settings = settings or settings_from_args()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(processors, settings))
