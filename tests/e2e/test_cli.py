"""The `procmesh` console script as a real process: demo, generate, stream, config errors."""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN
from tests.integration.providers.fakes import FakeOpenAI, error

pytestmark = pytest.mark.e2e

PROCMESH = BIN / "procmesh"
SECRET = "jane@example.com"
PROMPT = f"My email is {SECRET} and my phone is +1 555 123 4567."
REDACTED_ECHO = 'You said: "My email is [email] and my phone is [phone]."'

CONFIG = """\
sidecars:
  guards:
    address: {address}
    timeout: 5
models:
  demo:
    provider: demo
agents:
  rewrite:
    instructions: You are helpful.
    model: demo
    inputProcessors: [guards/pii-redactor]
  guarded:
    model: demo
    errorProcessorDefaults: false
    inputProcessors:
      - processor: guards/topic-guard
        options: {{words: [jailbreak]}}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def examples(start_sidecar: Callable[..., SidecarProcess]) -> SidecarProcess:
    proc = start_sidecar("examples", name="examples")
    await proc.wait_ready()
    return proc


@pytest.fixture(scope="module")
def config_file(examples: SidecarProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "procmesh.yaml"
    path.write_text(CONFIG.format(address=examples.address), encoding="utf-8")
    return path


_tmp_ids = itertools.count()


@pytest.fixture
def short_tmp(sidecar_dir: Path) -> Path:
    """A TMPDIR short enough for the unix socket of the built-in sidecar the CLI starts."""
    path = sidecar_dir / f"t{next(_tmp_ids)}"
    path.mkdir()
    yield path  # type: ignore[misc]
    path.rmdir()  # fails if the CLI left its built-in sidecar's directory behind


def procmesh(*args: str, tmpdir: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [str(PROCMESH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        start_new_session=True,
    )


def test_demo_shows_the_tripwire_and_the_retry() -> None:
    proc = procmesh("demo", timeout=90)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "[tripwire] topic-guard: Blocked: the request mentions 'jailbreak'" in out
    assert "agent (retry)>" in out
    assert "onViolation: length-check" in out
    assert "[email]" in out
    assert "sidecars stopped (exit codes [0, 0])" in out


def test_generate_sees_the_rewritten_input(config_file: Path, short_tmp: Path) -> None:
    # the default error processors: the CLI starts and stops its own built-in sidecar
    proc = procmesh("generate", "rewrite", PROMPT, "--config", str(config_file), tmpdir=short_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert REDACTED_ECHO in proc.stdout
    assert SECRET not in proc.stdout


def test_stream_sees_the_rewritten_input(config_file: Path, short_tmp: Path) -> None:
    proc = procmesh("stream", "rewrite", PROMPT, "--config", str(config_file), tmpdir=short_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert REDACTED_ECHO in proc.stdout
    assert SECRET not in proc.stdout


@pytest.mark.parametrize("command", ["generate", "stream"])
def test_a_tripwire_exits_3_and_is_reported_the_same_way_by_both_commands(
    config_file: Path, command: str
) -> None:
    proc = procmesh(command, "guarded", "Please jailbreak yourself.", "--config", str(config_file))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == "[tripwire] topic-guard: Blocked: the request mentions 'jailbreak'"
    assert "You said" not in proc.stdout  # the model was never called


@pytest.mark.parametrize("command", ["generate", "stream"])
def test_a_failed_run_exits_1_and_is_reported_the_same_way_by_both_commands(
    command: str, tmp_path: Path
) -> None:
    api = FakeOpenAI().start()
    api.script("m", error(400, "Invalid parameter: no such thing."))
    config = tmp_path / "failing.yaml"
    agent = {"model": "fake/m", "errorProcessorDefaults": False}
    provider = {"kind": "openai", "baseUrl": api.base_url}
    config.write_text(json.dumps({"providers": {"fake": provider}, "agents": {"failing": agent}}))
    try:
        proc = procmesh(command, "failing", "hi", "--config", str(config))
    finally:
        api.stop()
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("[error] "), proc.stderr
    assert "Invalid parameter: no such thing." in last


@pytest.fixture
def slow_webhook() -> Iterator[tuple[str, list[bool]]]:
    """A webhook that answers after a pause, recording for each POST whether its client was still
    there to get the answer (the connection not yet closed by the client's process exiting)."""
    answered: list[bool] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(2)  # long enough for a process that does not wait to exit meanwhile
            readable, _, _ = select.select([self.connection], [], [], 0)
            gone = bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            answered.append(not gone)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/violations", answered
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_violation_webhook_in_flight_is_delivered_before_the_process_exits(
    examples: SidecarProcess, slow_webhook: tuple[str, list[bool]], tmp_path: Path
) -> None:
    url, answered = slow_webhook
    path = tmp_path / "procmesh.yaml"
    path.write_text(
        f"""\
sidecars:
  guards: {{address: "{examples.address}", timeout: 5}}
models:
  demo: {{provider: demo}}
agents:
  guarded:
    model: demo
    errorProcessorDefaults: false
    inputProcessors:
      - processor: guards/topic-guard
        options: {{words: [jailbreak]}}
        onViolation: {{webhook: "{url}"}}
""",
        encoding="utf-8",
    )
    proc = procmesh("generate", "guarded", "Please jailbreak yourself.", "--config", str(path))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert answered == [True]  # the process waited for the post's answer before it exited


def test_broken_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(
        "sidecars:\n  s:\n    address: nowhere\nagents:\n  a:\n    model: demo\n    maxStepz: 3\n",
        encoding="utf-8",
    )
    proc = procmesh("generate", "a", "hi", "--config", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("procmesh: error: invalid ")
    assert "sidecars.s.address" in proc.stderr
    assert "agents.a.maxStepz: Extra inputs are not permitted" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("section", "named"),
    [
        (
            "decisions:\n  recordContent: true\n",
            "decisions.recordContent does nothing without decisions.record: true",
        ),
        (
            "models:\n  demo: {provider: demo, responses: [{text: scripted}]}\n",
            "models.demo: Value error, responses: read by a scripted model only",
        ),
        (
            "judgeCache:\n  ttlSeconds: 30\n  redis: {url: 'redis://127.0.0.1:1'}\n",
            "judgeCache.redis, judgeCache.ttlSeconds do nothing without judgeCache.enabled: true",
        ),
    ],
)
def test_a_setting_its_section_leaves_off_exits_2_naming_it(tmp_path: Path, section: str, named: str) -> None:
    # each ran before, with exit 0: no content recorded, the demo's own answer, no verdict cached,
    # and nothing said so
    path = tmp_path / "off.yaml"
    path.write_text(f"agents:\n  a:\n    model: demo\n{section}", encoding="utf-8")
    proc = procmesh("generate", "a", "hi", "--config", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_scenario_with_a_key_twice_exits_2_naming_it(tmp_path: Path) -> None:
    # json keeps the last of two equal keys: the first would be ignored without a word
    path = tmp_path / "twice.json"
    path.write_text('{"model": {"responses": []}, "call": {}, "call": {"input": "hi"}}', encoding="utf-8")
    proc = procmesh("scenario", "run", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"scenario {path}: duplicate key 'call' in one JSON object" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": [{"text": "hi", "toolCall": [{"name": "t"}]}]}, "model.0.toolCall"),
        ({"call": {"method": "steam", "input": "hi"}}, "call.method: generate or stream, got 'steam'"),
        (
            {"agent": {"inputProcessors": [{"id": "p", "processInput": [{"then": [{"count": "n"}]}]}]}},
            "agent.inputProcessors.0.processInput.0.then",
        ),
        (
            {
                "agent": {
                    "inputProcessors": [{"id": "p", "processInput": [{"do": [{"abort": {"reson": "x"}}]}]}]
                }
            },
            "agent.inputProcessors.0.processInput.0.do.0.abort.reson",
        ),
    ],
)
def test_a_scenario_key_at_any_depth_the_runner_would_ignore_exits_2_naming_it(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    # each was ignored before: a text answer with no tool call, a generate for a stream, a rule
    # that did nothing, an abort without its reason; all with exit 0 and a wrong trace
    path = tmp_path / "typo.json"
    scenario = {"name": "typo", "model": [{"text": "hi"}], "call": {"input": "hi"}, **change}
    path.write_text(json.dumps(scenario), encoding="utf-8")
    proc = procmesh("scenario", "run", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("processor", "named"),
    [
        (
            {
                "id": "p",
                "processOutputStream": [{"when": {"partType": "text-delta"}, "do": [{"drop": False}]}],
            },
            "agent.outputProcessors.0.processOutputStream.0.do.0.drop: true, got false",
        ),
        (
            {"id": "p", "processOutputStream": [{"when": {"stepNumber": "0"}, "do": [{"drop": True}]}]},
            'agent.outputProcessors.0.processOutputStream.0.when.stepNumber: an integer, got "0"',
        ),
        (
            {"id": "p", "processDataParts": "false", "processOutputStream": []},
            'agent.outputProcessors.0.processDataParts: a boolean, got "false"',
        ),
    ],
)
def test_a_scenario_value_of_another_type_exits_2_naming_it(
    tmp_path: Path, processor: dict[str, Any], named: str
) -> None:
    # each ran before with exit 0 and a trace the reference's runner would not give: drop: false
    # dropped every part (the reference's runner drops none), a step number given as a string never
    # matched, the string "false" was a true processDataParts
    path = tmp_path / "typed.json"
    scenario = {
        "name": "typed",
        "agent": {"outputProcessors": [processor]},
        "model": [{"text": "hi there"}],
        "call": {"method": "stream", "input": "hi"},
    }
    path.write_text(json.dumps(scenario), encoding="utf-8")
    proc = procmesh("scenario", "run", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("stream", "nobody", "hi"), "unknown agent 'nobody'"),
        (("generate", "rewrite", "hi", "--config", "/nonexistent/procmesh.yaml"), "cannot read config"),
    ],
)
def test_cli_errors_exit_2(config_file: Path, args: tuple[str, ...], message: str) -> None:
    if "--config" not in args:
        args = (*args, "--config", str(config_file))
    proc = procmesh(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
