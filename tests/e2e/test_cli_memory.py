"""`procmesh generate|stream --thread --resource` and `procmesh memory` as real processes.

Two calls on one thread through the command line, then the store read back with `procmesh memory`
from the same config's `storage` section: both turns, in order. On SQLite (a data directory) and on
PostgreSQL (the DSN in an environment variable, as `dsnEnv` keeps a password out of the file).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.test_cli import PROCMESH, procmesh
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

CONFIG = """\
models:
  demo:
    provider: demo
storage: {storage}
agents:
  chat:
    model: demo
    errorProcessorDefaults: false
    memory: {{lastMessages: 10}}
  forgetful:
    model: demo
    errorProcessorDefaults: false
"""


__all__ = ["postgres_dsn"]  # the fixture, shared with the store safety tests
DSN_VARIABLE = "PROCMESH_TEST_CLI_MEMORY_DSN"


@pytest.fixture(params=["sqlite", "postgres"])
def config(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "sqlite":
        storage = json.dumps({"backend": "sqlite", "dataDir": str(tmp_path / "data")})
    else:  # the CLI processes inherit the variable
        monkeypatch.setenv(DSN_VARIABLE, fresh_dsn(request.getfixturevalue("postgres_dsn")))
        storage = json.dumps({"backend": "postgres", "dsnEnv": DSN_VARIABLE})
    path = tmp_path / "procmesh.yaml"
    path.write_text(CONFIG.format(storage=storage), encoding="utf-8")
    return str(path)


def ok(*args: str) -> str:
    proc = procmesh(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_two_calls_on_a_thread_are_stored_and_listed(config: str) -> None:
    ok("generate", "chat", "first question", "--config", config, "--thread", "t1", "--resource", "alice")
    ok("stream", "chat", "second question", "--config", config, "--thread", "t1", "--resource", "alice")
    ok("generate", "chat", "no thread: not saved", "--config", config)
    # an agent without memory: the run goes on, and stderr says the thread is not kept
    forgot = procmesh(
        "generate", "forgetful", "hi", "--config", config, "--thread", "t9", "--resource", "alice"
    )
    assert forgot.returncode == 0, forgot.stderr
    assert "agent 'forgetful' has no memory: --thread is not loaded or saved" in forgot.stderr

    threads = [
        json.loads(line)
        for line in ok("memory", "threads", "--resource", "alice", "--config", config, "--json").splitlines()
    ]
    assert [(t["id"], t["resourceId"]) for t in threads] == [("t1", "alice")]
    assert ok("memory", "threads", "--resource", "bob", "--config", config) == ""  # another's: nothing

    lines = ok("memory", "messages", "t1", "--resource", "alice", "--config", config, "--json").splitlines()
    stored = [json.loads(line) for line in lines]
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    texts = [p["text"] for m in stored for p in m["content"]["parts"] if p["type"] == "text"]
    assert texts[0] == "first question"
    assert texts[2] == "second question"
    assert all(m["threadId"] == "t1" and m["resourceId"] == "alice" for m in stored)

    text = ok("memory", "messages", "t1", "--resource", "alice", "--last", "2", "--config", config)
    assert [line.split("\t")[1] for line in text.splitlines()] == ["user", "assistant"]
    assert "second question" in text
    assert "first question" not in text


def test_a_missing_thread_and_a_thread_without_resource_are_clear_errors(config: str) -> None:
    proc = procmesh("memory", "messages", "nope", "--resource", "alice", "--config", config)
    assert proc.returncode == 1
    assert "no thread 'nope' of resource 'alice'" in proc.stderr
    assert proc.stdout == ""  # an error is never read as output
    proc = procmesh("generate", "chat", "hi", "--config", config, "--thread", "t1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "without a resource" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_thread_list_cut_at_its_limit_says_so(config: str) -> None:
    for thread in ("t1", "t2"):
        ok("generate", "chat", "hi", "--config", config, "--thread", thread, "--resource", "alice")
    cut = procmesh("memory", "threads", "--resource", "alice", "--limit", "1", "--config", config)
    assert cut.returncode == 0, cut.stderr
    assert [line.split("\t")[0] for line in cut.stdout.splitlines()] == ["t2"]  # the most recent
    assert "has more than --limit 1 threads" in cut.stderr
    whole = procmesh("memory", "threads", "--resource", "alice", "--limit", "2", "--config", config)
    assert [line.split("\t")[0] for line in whole.stdout.splitlines()] == ["t2", "t1"]
    assert whole.stderr == ""
    for limit in ("0", "10000"):  # 10 000: one more than the store's page would not fit
        bad = procmesh("memory", "threads", "--resource", "alice", "--limit", limit, "--config", config)
        assert bad.returncode == 2, (limit, bad.stderr)
        assert "--limit must be from 1 to 9999" in bad.stderr


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_that_stops_reading_is_no_traceback(config: str, buffered: bool) -> None:
    """`procmesh memory messages ... | head -0`: the pipe is closed before the command writes; it
    ends with 141, as a shell reports a command a closed pipe ended, and no traceback. Python's
    stdout to a pipe is buffered (the write fails as the command ends) unless PYTHONUNBUFFERED is
    set (each print fails): both."""
    ok("generate", "chat", "hi", "--config", config, "--thread", "t1", "--resource", "alice")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command starts
    try:
        proc = subprocess.run(
            [str(PROCMESH), "memory", "messages", "t1", "--resource", "alice", "--config", config, "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "BrokenPipe" not in proc.stderr
