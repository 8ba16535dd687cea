"""procmesh-check-sidecar for CI: --json, --junit-xml and TLS flags, against a real mTLS sidecar."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

import procmesh
from tests.conftest import BIN
from tests.e2e.test_resilience import make_pki

pytestmark = pytest.mark.e2e

CHECK = str(BIN / "procmesh-check-sidecar")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mtls_sidecar(pki: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("sidecar") / "sidecar.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(BIN / "procmesh-sidecar"),
                "examples",
                "--listen",
                address,
                "--tls-cert",
                pki["server_cert"],
                "--tls-key",
                pki["server_key"],
                "--tls-client-ca",
                pki["ca"],
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")},
        )
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(15)


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHECK, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_checker_reports_json_and_junit_over_mtls(
    mtls_sidecar: str, pki: dict[str, str], tmp_path: Path
) -> None:
    junit = tmp_path / "report.xml"
    tls = ["--tls-ca", pki["ca"], "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]]
    proc = check(mtls_sidecar, *tls, "--tls-server-name", "localhost", "--json", "--junit-xml", str(junit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # one JSON object: the line report gave way to it
    assert report["address"] == mtls_sidecar
    assert report["failed"] == 0
    assert report["passed"] > 10
    assert {c["status"] for c in report["checks"]} <= {"PASS", "SKIP"}
    assert any(c["name"] == "health" for c in report["checks"])

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert int(suite.get("tests", "-1")) == len(report["checks"])
    assert suite.get("failures") == "0"
    assert int(suite.get("skipped", "-1")) == report["skipped"]
    assert [c.get("name") for c in suite.iter("testcase")] == [c["name"] for c in report["checks"]]


def test_without_the_client_certificate_the_checks_fail(mtls_sidecar: str, pki: dict[str, str]) -> None:
    proc = check(mtls_sidecar, "--tls-ca", pki["ca"], "--wait", "1", "--timeout", "1", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["failed"] >= 1


def test_a_failing_check_is_a_junit_failure(tmp_path: Path) -> None:
    junit = tmp_path / "report.xml"
    # Nothing listens there: health fails, and JUnit says so with the check's detail.
    proc = check(f"127.0.0.1:{free_port()}", "--wait", "0.5", "--timeout", "0.5", "--junit-xml", str(junit))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failures = list(ET.parse(junit).getroot().iter("failure"))
    assert failures
    assert all(f.get("message") for f in failures)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tls-cert", "c.pem"), "--tls-cert and --tls-key go together"),
        (("--tls-server-name", "x"), "need --tls-ca"),
        (("--tls-ca", "/nonexistent/ca.pem"), "cannot read a TLS file"),
    ],
)
def test_bad_tls_flags_exit_2(args: tuple[str, ...], message: str) -> None:
    proc = check("127.0.0.1:1", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version() -> None:
    proc = check("--version")
    assert proc.stdout.strip() == f"procmesh-check-sidecar {procmesh.__version__}"
