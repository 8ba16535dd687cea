"""The command line of ``procmesh-check-sidecar`` (and ``procmesh check-sidecar``): flags to a run."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc

from procmesh._check.checker import check
from procmesh._check.formats import junit_xml, report_json
from procmesh._server import channel_credentials
from procmesh._version import __version__


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check that a sidecar (any language) keeps the procmesh.v1 contract; "
        "exit 1 if a check fails.",
    )
    parser.add_argument("address", help="host:port or unix:///path.sock")
    parser.add_argument("--processor", help="check only this processor (default: every hosted one)")
    parser.add_argument(
        "--options",
        action="append",
        default=[],
        metavar="[ID=]JSON",
        help="options (a JSON object) sent to processor ID, or to every processor not named by another "
        "--options; repeatable, e.g. --options 'guard={\"words\": [\"x\"]}' --options 'shout={}'",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds to wait for SERVING (default 10)")
    parser.add_argument(
        "--json", action="store_true", help="print the report as one JSON object instead of lines"
    )
    parser.add_argument("--junit-xml", metavar="FILE", help="also write the report as JUnit XML (for CI)")
    parser.add_argument("--tls-ca", metavar="PEM", help="connect with TLS, trusting this CA")
    parser.add_argument("--tls-cert", metavar="PEM", help="client certificate for mTLS (with --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM", help="key of --tls-cert")
    parser.add_argument(
        "--tls-server-name", metavar="NAME", help="name to verify in the sidecar's certificate"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _credentials(args: argparse.Namespace, parser: argparse.ArgumentParser) -> grpc.ChannelCredentials | None:
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_ca is None:
        if args.tls_cert or args.tls_server_name:
            parser.error("--tls-cert and --tls-server-name need --tls-ca")
        return None
    try:
        return channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    except OSError as exc:
        parser.error(f"cannot read a TLS file: {exc}")


def parse_options(
    values: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """The ``--options`` values as (options for every processor, options by processor id).

    A value that is JSON is the options for every processor (a processor's options are a JSON
    object, so `{...}` never reads as ``ID=...``); any other value is ``ID=JSON``. Malformed
    values exit with status 2 through `parser`.
    """
    shared: dict[str, Any] | None = None
    by_id: dict[str, dict[str, Any]] = {}
    for raw in values:
        try:
            value = json.loads(raw)
        except ValueError as exc:
            pid, sep, text = raw.partition("=")
            if not sep or not pid.strip():
                parser.error(f"--options is not JSON nor ID=JSON: {exc}")
            pid = pid.strip()
            if pid in by_id:
                parser.error(f"--options: processor {pid!r} is given options twice")
            try:
                value = json.loads(text)
            except ValueError as err:
                parser.error(f"--options {pid}=...: not JSON: {err}")
            if not isinstance(value, dict):
                parser.error(f"--options {pid}=...: options must be a JSON object")
            by_id[pid] = value
            continue
        if not isinstance(value, dict):
            parser.error("--options must be a JSON object")
        if shared is not None:
            parser.error("--options: options for every processor are given twice")
        shared = value
    return shared, by_id


def main(argv: Sequence[str] | None, prog: str) -> int:
    """Parse `argv`, run every check, print the report; 0 when no check failed, else 1."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    options, by_id = parse_options(args.options, parser)
    credentials = _credentials(args, parser)
    started = time.monotonic()
    report = asyncio.run(
        check(
            args.address,
            processor=args.processor,
            options=options,
            processor_options=by_id,
            timeout=args.timeout,
            wait=args.wait,
            credentials=credentials,
            server_name=args.tls_server_name,
            out=io.StringIO() if args.json else sys.stdout,  # --json: the lines give way to one object
        )
    )
    if args.json:
        print(report_json(report, args.address))
    if args.junit_xml:
        try:
            with open(args.junit_xml, "w", encoding="utf-8") as f:
                f.write(junit_xml(report, args.address, time.monotonic() - started))
        except OSError as exc:
            parser.error(f"cannot write --junit-xml {args.junit_xml}: {exc.strerror or exc}")
    return 1 if report.count("FAIL") else 0
