"""run(): serve processors until SIGTERM/SIGINT, then drain gracefully."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn

from prometheus_client import disable_created_metrics
from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from procmesh import _model, tracing
from procmesh._logging import LOG_FORMATS, LogFormat, configure_logging
from procmesh._processor import Processor
from procmesh._server import ProcessorServer, server_credentials, unix_path
from procmesh._tool import Tool
from procmesh._version import __version__
from procmesh.environment import check_environment

log = logging.getLogger(__name__)

_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class ProcessorSettings(BaseSettings):
    """Sidecar settings from the environment (``PROCMESH_`` prefix) and the command line."""

    model_config = SettingsConfigDict(env_prefix="PROCMESH_", frozen=True, use_attribute_docstrings=True)

    listen: Annotated[list[str], NoDecode] = ["127.0.0.1:50051"]
    """Addresses to serve on: ``host:port`` or ``unix:///path.sock`` (in the env: one address, or a
    JSON list)."""
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
    log_format: LogFormat = "text"
    """``text`` (default) or ``json``: one JSON object per line (time, level, logger, message)."""
    tls_cert: str | None = None
    """PEM certificate to serve TLS with (plaintext when unset)."""
    tls_key: str | None = None
    """PEM key of `tls_cert`."""
    tls_client_ca: str | None = None
    """PEM CA that client certificates must chain to (enables mTLS)."""
    parent_pid: int | None = None
    """Exit when this process is no longer our parent (a sidecar started by an orchestrator)."""
    model_gateway: str | None = None
    """The orchestrator's model gateway for hooks' ``model`` argument: its gRPC address,
    ``host:port`` or ``unix:///path.sock`` (unset: hooks cannot call models)."""
    model_gateway_key: SecretStr | None = None
    """An API key of the orchestrator, sent to the gateway (best from the environment)."""
    model_gateway_ca: str | None = None
    """PEM CA that verifies the orchestrator's TLS gRPC port (set: the gateway link is TLS)."""
    model_gateway_cert: str | None = None
    """PEM client certificate for an orchestrator that requires one (mTLS; needs the CA)."""
    model_gateway_cert_key: str | None = None
    """PEM key of `model_gateway_cert`."""

    @field_validator("listen", mode="before")
    @classmethod
    def _one_or_list(cls, value: Any) -> Any:
        # PROCMESH_LISTEN=127.0.0.1:50051 is what people write; a JSON list serves several.
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except ValueError:
                    raise ValueError(f"not a JSON list of addresses: {text[:80]!r}") from None
            return [text]
        return value

    @field_validator("listen")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one address is needed")
        for address in value:
            _check_address(address)
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in _LEVELS:
            raise ValueError(f"must be one of {', '.join(_LEVELS)} (got {value!r})")
        return value.upper()


def _check_address(address: str) -> None:
    """Raise ValueError unless `address` is ``unix:PATH`` or ``host:port`` with a port number."""
    if address.startswith("unix:"):
        if not unix_path(address):
            raise ValueError(f"{address!r}: a unix address needs a path, e.g. unix:///run/procmesh/p.sock")
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{address!r} is not host:port (e.g. 127.0.0.1:50051) or unix:///path.sock")


def settings_parser(prog: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
    """The SDK's command line (``--listen``, ``--metrics-port``, ..., ``--version``) as a parser.

    A program with flags of its own adds them to this parser, parses once (unknown flags are an
    error, exit status 2) and hands the namespace to `settings_from_args`.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or "Serve procmesh processors.",
        epilog="Every flag has an environment variable: PROCMESH_ and the flag's name in capitals "
        "(--metrics-port: PROCMESH_METRICS_PORT; PROCMESH_LISTEN takes one address or a JSON list). "
        "Flags win.",
    )
    parser.add_argument(
        "--listen", action="append", help="address to serve on (repeatable): host:port or unix:///path.sock"
    )
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-host", help="interface of the metrics port (default: where gRPC binds)")
    parser.add_argument(
        "--hook-threads",
        action=argparse.BooleanOptionalAction,
        help="run each processor's hooks on a thread of its own (default) or inline on the server loop",
    )
    parser.add_argument("--grace-seconds", type=float, help="time in-flight calls get after SIGTERM")
    parser.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, help="text (default) or json: one JSON object per line"
    )
    parser.add_argument("--parent-pid", type=int, help="exit when this process is no longer the parent")
    parser.add_argument(
        "--model-gateway", help="the orchestrator's gRPC address for hooks' model calls (host:port)"
    )
    parser.add_argument(
        "--model-gateway-key",
        help="an orchestrator API key with the gateway role, for its gRPC port (none on its unix "
        "socket; prefer PROCMESH_MODEL_GATEWAY_KEY: a flag's value shows in the process list)",
    )
    parser.add_argument(
        "--model-gateway-ca", help="PEM CA of the orchestrator's TLS port (TLS to the gateway)"
    )
    parser.add_argument("--model-gateway-cert", help="PEM client certificate for the gateway (mTLS)")
    parser.add_argument("--model-gateway-cert-key", help="PEM key of --model-gateway-cert")
    parser.add_argument("--tls-cert", help="PEM certificate: serve TLS")
    parser.add_argument("--tls-key", help="PEM key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="PEM CA client certificates must chain to (mTLS)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def settings_from_args(argv: Sequence[str] | argparse.Namespace | None = None) -> ProcessorSettings:
    """Settings from the environment, overridden by flags (``--listen``, ``--metrics-port``, ...).

    Args:
        argv: The arguments (``sys.argv[1:]`` when None), parsed strictly by `settings_parser`;
            or a namespace a program's own parser (built on `settings_parser`) already returned.

    Bad settings (an unknown flag, ``PROCMESH_LISTEN`` that does not parse, a ``PROCMESH_*``
    variable no procmesh component reads: `procmesh.environment`) print one line and exit with
    status 2.
    """
    args = argv if isinstance(argv, argparse.Namespace) else settings_parser().parse_args(argv)
    # A PROCMESH_ variable no procmesh component reads is a typo: never serve on the defaults it
    # was meant to change (another component's, from a shared ConfigMap, is only noted by `run`).
    if (unknown := check_environment("python-sidecar", os.environ).error()) is not None:
        _fail(unknown)
    fields = ProcessorSettings.model_fields
    overrides = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    try:
        return ProcessorSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _fail(f"invalid settings: {problems}")
    except SettingsError as exc:
        _fail(f"invalid settings: {exc}")


def _fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2: what argparse does for a bad flag, for any bad setting."""
    print(f"{os.path.basename(sys.argv[0]) or 'procmesh'}: error: {message}", file=sys.stderr)
    sys.exit(2)


class _StartError(Exception):
    """A setting that only fails when used (an address in use, an unreadable certificate)."""


def _check_bindable(address: str) -> None:
    """Fail with `_StartError` now if an address cannot be bound.

    gRPC's own failure is a RuntimeError plus a C-core log line; a test bind says which address
    and why (in use, not an interface of this host; for a unix socket, a directory that cannot be
    made, a path too long or not writable) in one line.
    """
    if address.startswith("unix:"):
        path = unix_path(address)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a stale socket from a previous run, as the server does
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.bind(path)
            os.unlink(path)
        except OSError as exc:
            raise _StartError(f"cannot listen on {address}: {exc.strerror or exc}") from None
        return
    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise _StartError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is fine
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise _StartError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def idle_settings(settings: ProcessorSettings) -> list[str]:
    """A line for each setting given that does nothing without another (a shared ConfigMap may set
    it on purpose, so it is no error: `serve` logs each as a WARNING naming it and why)."""
    lines = []
    if settings.metrics_host and settings.metrics_port is None:
        lines.append(
            "--metrics-host (PROCMESH_METRICS_HOST) does nothing: no --metrics-port "
            "(PROCMESH_METRICS_PORT), so no metrics endpoint is served"
        )
    if not settings.model_gateway:
        for name in ("model_gateway_key", "model_gateway_ca", "model_gateway_cert", "model_gateway_cert_key"):
            if getattr(settings, name):
                flag, variable = "--" + name.replace("_", "-"), "PROCMESH_" + name.upper()
                lines.append(
                    f"{flag} ({variable}) does nothing: no --model-gateway (PROCMESH_MODEL_GATEWAY), "
                    "so hooks cannot call models"
                )
    return lines


async def serve(
    processors: Sequence[Processor], settings: ProcessorSettings, *, tools: Sequence[Tool] = ()
) -> None:
    """Serve processors and `tools` until SIGTERM or SIGINT, then stop within the grace period.
    A setting that does nothing without another is served anyway, with a WARNING (`idle_settings`)."""
    for line in idle_settings(settings):
        log.warning(line)
    credentials = None
    if settings.tls_client_ca and not (settings.tls_cert or settings.tls_key):
        # a client CA alone would serve plaintext, requiring no client certificate: never mTLS
        # silently turned off
        raise _StartError(
            "--tls-client-ca (mTLS) needs --tls-cert and --tls-key: the sidecar must serve TLS first"
        )
    if settings.tls_cert or settings.tls_key:
        if not (settings.tls_cert and settings.tls_key):
            raise _StartError("TLS needs both --tls-cert and --tls-key")
        try:
            credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        except OSError as exc:
            raise _StartError(f"cannot read a TLS file: {exc}") from None
    key = settings.model_gateway_key.get_secret_value() if settings.model_gateway_key else None
    try:
        gateway_tls = _model.gateway_tls(
            settings.model_gateway_ca, settings.model_gateway_cert, settings.model_gateway_cert_key
        )
    except ValueError as exc:
        raise _StartError(str(exc)) from None
    _model.configure(settings.model_gateway, key, gateway_tls)
    server = ProcessorServer(
        processors,
        settings.listen,
        metrics_port=settings.metrics_port,
        metrics_host=settings.metrics_host,
        credentials=credentials,
        hook_threads=settings.hook_threads,
        tools=tools,
    )
    for address in settings.listen:
        _check_bindable(address)
    if settings.metrics_port:
        _check_bindable(f"{server.metrics_host}:{settings.metrics_port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # The processors, their options and the server live as long as the process: frozen out of the
    # cycle collector's reach, its full collections walk only what calls make (the built-in
    # sidecar's held its loop 22-63 ms every few seconds of bench P8 before).
    gc.collect()
    gc.freeze()
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
    log.warning("parent process %d is gone; stopping", parent_pid)
    stop.set()


def run(
    processors: Sequence[Processor], settings: ProcessorSettings | None = None, *, tools: Sequence[Tool] = ()
) -> None:
    """Serve processors (and hosted `tools`) until SIGTERM/SIGINT (a sidecar's ``main()``).

    A setting that fails at start (an address in use, a missing certificate, a ``PROCMESH_*``
    variable no procmesh component reads, given `settings` or not) prints one line and exits with
    status 2, like a bad flag.
    """
    settings = settings or settings_from_args()
    # Settings built in code read the environment too (ProcessorSettings is a BaseSettings): the
    # check of `settings_from_args` holds for them as well.
    check = check_environment("python-sidecar", os.environ)
    if (unknown := check.error()) is not None:
        _fail(unknown)
    configure_logging(settings.log_level, settings.log_format)
    if (note := check.note()) is not None:
        log.info(note)  # another component's variables (a shared ConfigMap): named, not read
    # A `_created` series per counter and histogram doubles what is scraped and stored for a
    # timestamp no dashboard uses; the switch is process-wide, so only programs flip it.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    tracing.setup(os.path.basename(sys.argv[0]) or "procmesh-sidecar")  # OTEL_* decide; off by default
    try:
        asyncio.run(serve(processors, settings, tools=tools))
    except _StartError as exc:
        _fail(str(exc))
    finally:
        tracing.shutdown()  # export what is buffered
