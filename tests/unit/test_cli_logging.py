"""--log-format json: one JSON object per line, with the run id of the run that logged it."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from procmesh import RUN_ID, TRACE_ID, JsonFormatter, configure_logging
from procmesh_orchestrator.run.hooks import InputResult
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("procmesh.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_a_line_has_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(record("hello %s\nsecond line", "world"))
    assert "\n" not in line  # one object per line, whatever the message holds
    entry = json.loads(line)
    assert set(entry) == {"time", "level", "logger", "message"}  # no run: no run_id, no trace_id
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "procmesh.test"
    assert entry["message"] == "hello world\nsecond line"
    assert entry["time"].endswith("Z")
    assert entry["time"][10] == "T"
    assert len(entry["time"]) == 24


def test_run_and_trace_ids_are_added_when_set() -> None:
    run_token, trace_token = RUN_ID.set("run-1"), TRACE_ID.set("0af7651916cd43dd8448eb211c80319c")
    try:
        entry = json.loads(JsonFormatter().format(record("inside")))
    finally:
        RUN_ID.reset(run_token)
        TRACE_ID.reset(trace_token)
    assert entry["run_id"] == "run-1"
    assert entry["trace_id"] == "0af7651916cd43dd8448eb211c80319c"


def test_a_traceback_stays_inside_the_object() -> None:
    entry = json.loads(JsonFormatter().format(record("failed", exc=True)))
    assert entry["exception"].startswith("Traceback")
    assert "ValueError: boom" in entry["exception"]


def test_a_message_argument_of_any_type_does_not_break_the_line() -> None:
    entry = json.loads(JsonFormatter().format(record("%s", object())))
    assert entry["message"].startswith("<object object at")


@pytest.mark.parametrize(("fmt", "level"), [("xml", "INFO"), ("json", "LOUD")])
def test_unknown_format_or_level_is_refused(fmt: str, level: str) -> None:
    with pytest.raises(ValueError, match=r"xml|LOUD"):
        configure_logging(level, fmt)


def test_the_env_variable_chooses_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCMESH_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="yaml"):
        configure_logging("INFO")


async def test_the_orchestrator_sets_the_run_id_for_the_length_of_a_run() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.run")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def noisy(args: Any, info: Any) -> Any:
        logger.info("inside the run")  # what a processor call, a provider or a retry logs
        return reply(InputResult())

    log: list[Call] = []
    try:
        guarded = agent(FakeModel({"text": "ok"}), log, input=(FakeProcessor("p", {"process_input": noisy}),))
        result = await guarded.generate("hi")
        logger.info("after the run")
    finally:
        logger.removeHandler(handler)
    inside, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["run_id"] == result.run_id
    assert "run_id" not in after
    assert RUN_ID.get() == ""


_HTTPX_PROGRAM = """
import http.server, logging, sys, threading
import httpx
from procmesh import configure_logging
configure_logging("INFO")
logging.getLogger().handlers.clear()  # configured again, as a program may: the last level counts
configure_logging(sys.argv[1])
class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
threading.Thread(target=server.serve_forever, daemon=True).start()
assert httpx.get(f"http://127.0.0.1:{server.server_port}/metrics?key=secret").status_code == 200
"""


@pytest.mark.parametrize(("level", "shown"), [("INFO", False), ("DEBUG", True)])
def test_httpx_request_lines_show_at_debug_only(level: str, shown: bool) -> None:
    """A real request through httpx in a program that called configure_logging: its per-request
    line (the URL, which may carry a key) is in the log at DEBUG and not at INFO."""
    done = subprocess.run(
        [sys.executable, "-c", _HTTPX_PROGRAM, level], capture_output=True, text=True, timeout=60, check=True
    )
    assert ("/metrics?key=secret" in done.stderr) is shown, done.stderr
