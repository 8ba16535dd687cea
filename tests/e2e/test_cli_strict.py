"""Every console script behaves: --version, strict flags, --help, one-line errors, JSON logs.

Real processes from the console scripts (and the Node SDK's ``run``): an unknown flag is an
error (``procmesh-sidecar --listne ...`` used to serve on the default port), a bad setting
prints one line and exits 2 without a traceback, ``--log-format json`` writes JSON lines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import procmesh
from procmesh import ProcessorSettings
from tests.conftest import BIN, NODE_SDK
from tests.deps import require

pytestmark = pytest.mark.e2e

SCRIPTS = ["procmesh", "procmesh-orchestrator", "procmesh-sidecar"]
NODE_SERVE = NODE_SDK / "examples" / "serve.mjs"


def run(
    *command: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}
    return subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**environ, **(env or {})},
    )


def one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, proc.stderr


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_version(script: str) -> None:
    proc = run(str(BIN / script), "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{script} {procmesh.__version__}"


def test_an_unknown_flag_is_an_error_not_the_default_port() -> None:
    proc = run(str(BIN / "procmesh-sidecar"), "examples", "--listne", "127.0.0.1:0", timeout=10)
    one_line_error(proc, "unrecognized arguments: --listne")


def test_a_scenario_without_the_scripted_set_is_an_error_not_ignored(tmp_path: Path) -> None:
    # it served the examples before, the scenario unread (the test then timed out)
    scenario = tmp_path / "s.json"
    scenario.write_text("{}", encoding="utf-8")
    proc = run(
        str(BIN / "procmesh-sidecar"),
        "examples",
        "--scenario",
        str(scenario),
        "--listen",
        "127.0.0.1:0",
        timeout=10,
    )
    one_line_error(proc, "--scenario: only the 'scripted' set reads a scenario")


def test_the_sidecar_help_shows_every_setting() -> None:
    proc = run(str(BIN / "procmesh-sidecar"), "--help")
    assert proc.returncode == 0, proc.stderr
    for name in ProcessorSettings.model_fields:
        assert f"--{name.replace('_', '-')}" in proc.stdout, name
    assert "--scenario" in proc.stdout
    assert "--version" in proc.stdout


def test_the_orchestrator_help_names_every_variable() -> None:
    from procmesh_orchestrator.settings import OrchestratorSettings

    proc = run(str(BIN / "procmesh-orchestrator"), "--help")
    assert proc.returncode == 0, proc.stderr
    for name in OrchestratorSettings.model_fields:
        assert f"PROCMESH_{name.upper()}" in proc.stdout, name
    assert "--log-format" in proc.stdout


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"PROCMESH_LISTEN": "nope"}, ("invalid settings", "'nope' is not host:port")),
        ({"PROCMESH_LISTEN": "[1,"}, ("invalid settings", "not a JSON list")),
        ({"PROCMESH_LOG_LEVEL": "LOUD"}, ("log_level",)),
        ({"PROCMESH_LOG_FORMAT": "xml"}, ("log_format",)),
        ({"PROCMESH_METRICS_PORT": "many"}, ("metrics_port",)),
    ],
)
def test_a_bad_sidecar_setting_is_one_line_and_exit_2(
    env: dict[str, str], fragments: tuple[str, ...]
) -> None:
    one_line_error(run(str(BIN / "procmesh-sidecar"), "examples", env=env, timeout=10), *fragments)


def test_a_port_in_use_is_one_line_and_exit_2(busy_port: int) -> None:
    proc = run(str(BIN / "procmesh-sidecar"), "examples", "--listen", f"127.0.0.1:{busy_port}", timeout=10)
    one_line_error(proc, f"cannot listen on 127.0.0.1:{busy_port}", "in use")
    metrics = run(
        str(BIN / "procmesh-sidecar"), "examples", "--listen", "127.0.0.1:0", "--metrics-port", str(busy_port)
    )
    one_line_error(metrics, f":{busy_port}", "in use")


def test_the_orchestrator_port_in_use_is_one_line(busy_port: int, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "models: {demo: {provider: demo}}\nagents: {a: {model: demo, errorProcessorDefaults: false}}\n"
    )
    proc = run(
        str(BIN / "procmesh-orchestrator"),
        "--config",
        str(config),
        "--http-port",
        str(busy_port),
        "--grpc-port",
        "0",
    )
    one_line_error(proc, "cannot bind the HTTP API", str(busy_port))
    bad = run(str(BIN / "procmesh-orchestrator"), "--config", str(config), env={"PROCMESH_LOG_FORMAT": "xml"})
    one_line_error(bad, "log format must be one of text, json")


def test_generate_reads_procmesh_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "models: {demo: {provider: demo}}\nagents: {a: {model: demo, errorProcessorDefaults: false}}\n"
    )
    proc = run(
        str(BIN / "procmesh"), "generate", "a", "hello", "--json", env={"PROCMESH_CONFIG_FILE": str(config)}
    )
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["text"].startswith('You said: "hello"')
    assert body["finishReason"] == "stop"
    assert body["runId"]
    stream = run(
        str(BIN / "procmesh"), "stream", "a", "hello", "--json", env={"PROCMESH_CONFIG_FILE": str(config)}
    )
    assert stream.returncode == 0, stream.stderr
    chunks = [json.loads(line) for line in stream.stdout.splitlines()]
    assert chunks[0]["type"] == "start"
    assert chunks[-1]["type"] == "finish"
    assert {c["runId"] for c in chunks} == {chunks[0]["payload"]["runId"]}
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta").startswith("You said")
    missing = run(str(BIN / "procmesh"), "generate", "a", "hello")
    one_line_error(missing, "--config FILE (or PROCMESH_CONFIG_FILE) is required")
    renamed = run(str(BIN / "procmesh"), "generate", "a", "hello", env={"PROCMESH_CONFIG": str(config)})
    one_line_error(renamed, "PROCMESH_CONFIG was renamed PROCMESH_CONFIG_FILE")


def serve_briefly(command: list[str], env: dict[str, str]) -> str:
    """Start a sidecar, wait for its 'serving' line, stop it with SIGTERM; its stderr."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PROCMESH_")}
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**environ, **env}
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "serving processors" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=20)
    return "".join(lines) + rest


def test_the_python_sidecar_logs_json_lines() -> None:
    out = serve_briefly(
        [str(BIN / "procmesh-sidecar"), "examples", "--listen", "127.0.0.1:0"],
        {"PROCMESH_LOG_FORMAT": "json"},
    )
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert any(e["message"].startswith("serving processors") for e in entries), out
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)


def test_the_node_sidecar_is_strict_versioned_and_logs_json() -> None:
    node = require("node")  # a missing node fails with its install hint: the suite never skips
    version = run(node, str(NODE_SERVE), "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().endswith(procmesh.__version__)
    one_line_error(run(node, str(NODE_SERVE), "--listne", "127.0.0.1:0", timeout=10), "unknown flag --listne")
    one_line_error(run(node, str(NODE_SERVE), env={"PROCMESH_LOG_FORMAT": "xml"}, timeout=10), "xml")
    out = serve_briefly([node, str(NODE_SERVE), "--listen", "127.0.0.1:0", "--log-format", "json"], {})
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert any(e["message"].startswith("serving processors") for e in entries), out
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)
