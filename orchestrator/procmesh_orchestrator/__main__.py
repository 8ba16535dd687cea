"""procmesh-orchestrator --config FILE [--http-port N] [--grpc-port N] ...: serve the agents."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from prometheus_client import disable_created_metrics
from pydantic import ValidationError
from pydantic_settings import SettingsError

from procmesh import __version__, configure_logging, tracing
from procmesh.environment import check_environment
from procmesh_orchestrator.app import secret_variables
from procmesh_orchestrator.config import Config, load_config
from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.service import serve
from procmesh_orchestrator.settings import OrchestratorSettings

log = logging.getLogger("procmesh_orchestrator")


def _environment_help() -> str:
    """Every setting's variable, so --help shows what the flags do not (API keys stay env-only)."""
    lines = ["environment (flags win; PROCMESH_LOG_FORMAT: text or json):"]
    for name, field in OrchestratorSettings.model_fields.items():
        summary = " ".join((field.description or "").replace("``", "").split()).partition(". ")[0].rstrip(".")
        lines.append(f"  PROCMESH_{name.upper():<26} {summary}")
    return "\n".join(lines)


def settings_from_args(argv: Sequence[str] | None = None) -> OrchestratorSettings:
    """Settings from the environment (``PROCMESH_*``), overridden by command-line flags.

    API keys come from ``PROCMESH_API_KEYS`` only: a flag would show them in ``ps``.
    """
    return _parse(argv)[0]


def _parse(argv: Sequence[str] | None) -> tuple[OrchestratorSettings, str | None]:
    """The serving settings, and the ``--log-format`` flag (None: ``PROCMESH_LOG_FORMAT`` decides)."""
    parser = argparse.ArgumentParser(
        prog="procmesh-orchestrator",
        description="Serve the configured agents over HTTP (reference-server routes) and gRPC.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_environment_help(),
    )
    parser.add_argument(
        "--config", dest="config_file", help="YAML configuration file (or PROCMESH_CONFIG_FILE)"
    )
    parser.add_argument("--http-host", help="HTTP interface (default 127.0.0.1)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 4111; 0: any free port)")
    parser.add_argument("--grpc-host", help="gRPC interface (default 127.0.0.1)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50050; 0: any free port)")
    parser.add_argument("--grpc-socket", help="also serve gRPC on this unix socket (the pod's sidecars)")
    parser.add_argument("--tls-cert", help="PEM certificate: both APIs serve TLS only (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", help="PEM CA: both APIs require a client certificate it signed (mTLS)"
    )
    parser.add_argument("--max-request-bytes", type=int, help="largest request accepted")
    parser.add_argument("--drain-grace-seconds", type=float, help="time in-flight runs get after SIGTERM")
    parser.add_argument("--log-level", help="logging level (default INFO)")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text (default) or json: one JSON object per line, with run_id (or PROCMESH_LOG_FORMAT)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="serve without API keys on a non-loopback interface (open to anyone who reaches it)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)
    log_format = args.log_format
    del args.log_format  # not a serving setting: main() configures logging with it
    if "PROCMESH_CONFIG" in os.environ:
        # Renamed: silently ignoring a deployment's config path would start the wrong agents.
        parser.error(
            "PROCMESH_CONFIG was renamed PROCMESH_CONFIG_FILE (PROCMESH_CONFIG__<KEY> variables override "
            "keys of the file)"
        )
    # Before the config names its own variables, a settings failure names what may have caused
    # it: a misspelt PROCMESH_CONFIG_FILE leaves the path unset (`_check_environment` follows).
    unknown = check_environment("orchestrator", os.environ).error()
    hint = f" ({unknown})" if unknown else ""
    overrides = {key: value for key, value in vars(args).items() if value is not None}
    try:
        settings = OrchestratorSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        parser.error(f"invalid settings: {problems}{hint}")
    except SettingsError as exc:
        parser.error(f"invalid settings: {exc}{hint}")
    if settings.config_file is None:
        parser.error(f"--config FILE (or PROCMESH_CONFIG_FILE) is required{hint}")
    return settings, log_format


def _check_environment(config: Config) -> None:
    """Exit (status 2) naming a ``PROCMESH_*`` variable no procmesh component reads and the config
    does not name (a typo must not serve on defaults); log the ones another component reads."""
    check = check_environment("orchestrator", os.environ, also=secret_variables(config))
    if (error := check.error()) is not None:
        print(f"procmesh-orchestrator: error: {error}", file=sys.stderr)
        sys.exit(2)
    if (note := check.note()) is not None:
        log.info(note)


def main(argv: Sequence[str] | None = None) -> None:
    settings, log_format = _parse(argv)
    try:
        configure_logging(settings.log_level, log_format)
    except ValueError as exc:  # PROCMESH_LOG_FORMAT or PROCMESH_LOG_LEVEL
        print(f"procmesh-orchestrator: error: {exc}", file=sys.stderr)
        sys.exit(2)
    # No `_created` series: they double what is scraped for a timestamp no dashboard uses.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    tracing.setup("procmesh-orchestrator")  # the OTEL_* variables decide; off by default
    try:
        config = load_config(settings.config_file or "")
        _check_environment(config)
        asyncio.run(serve(settings, config))
    except (OrchestratorError, OSError) as exc:
        print(f"procmesh-orchestrator: error: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        tracing.shutdown()  # export what is buffered


if __name__ == "__main__":
    main()
