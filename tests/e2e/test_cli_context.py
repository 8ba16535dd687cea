"""`procmesh generate|stream --context KEY=VALUE` as a real process: each entry reaches the run's
request context (VALUE as JSON when it parses, else a string), checked against the agent's
requestContextSchema; a refused context exits 2 naming the key, before any run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import procmesh

pytestmark = pytest.mark.e2e

CONFIG = """\
models:
  demo:
    provider: demo
agents:
  a:
    model: demo
    errorProcessorDefaults: false
    requestContextSchema:
      properties:
        tenant: {type: string}
        limit: {type: integer}
        flags: {type: object, properties: {beta: {const: true}}, required: [beta]}
      required: [tenant]
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "procmesh.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("command", ["generate", "stream"])
def test_entries_reach_the_run_as_json_or_strings(config: str, command: str) -> None:
    args = ["--context", "tenant=acme", "--context", "limit=7", "--context", 'flags={"beta": true}']
    proc = procmesh(command, "a", "hello", "--config", config, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip()


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        (["limit=7"], "requestContext: agent 'a' requires 'tenant' (requestContextSchema)"),
        (["tenant=acme", "limit=seven"], "requestContext.limit: 'seven' is not of type 'integer'"),
        (["tenant=7"], "requestContext.tenant: 7 is not of type 'string'"),
        (["tenant=acme", "region=eu"], "requestContext: agent 'a' does not declare 'region'"),
    ],
)
def test_a_refused_context_exits_2_naming_the_key(config: str, entries: list[str], error: str) -> None:
    args = [a for entry in entries for a in ("--context", entry)]
    proc = procmesh("generate", "a", "hello", "--config", config, *args)
    assert proc.returncode == 2
    assert f"procmesh: error: {error}" in proc.stderr


def test_an_entry_without_a_key_is_a_usage_error(config: str) -> None:
    proc = procmesh("generate", "a", "hello", "--config", config, "--context", "=x")
    assert proc.returncode == 2
    assert "--context: expected KEY=VALUE, got '=x'" in proc.stderr


def test_a_key_given_twice_is_a_usage_error(config: str) -> None:
    # the last value was taken before, the first dropped without a word
    args = ["--context", "tenant=acme", "--context", "tenant=globex"]
    proc = procmesh("generate", "a", "hello", "--config", config, *args)
    assert proc.returncode == 2, proc.stdout
    assert "--context: 'tenant' given more than once (give each key once)" in proc.stderr
