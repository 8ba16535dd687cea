"""A key of a storage or event-log backend (or MCP transport) the config does not choose is
refused at start-up, through the real ``procmesh-orchestrator`` process: ``dsnEnv`` without
``backend: postgres`` once started each replica on a SQLite file of its own (memory, suspended and
durable runs not shared), ``url`` without ``backend: redis`` on an event log of its own, a stdio
MCP server's ``headers`` were never sent, without a word. So is a setting that needs another:
``PROCMESH_MAX_INFLIGHT_PER_KEY`` without API keys limited no caller; and an override whose name
matches two keys (case and underscores aside) set the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.e2e.test_cli_strict import run

pytestmark = pytest.mark.e2e

AGENTS = "models: {demo: {provider: demo}}\nagents: {a: {model: demo, errorProcessorDefaults: false}}\n"


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("storage: {dsnEnv: MEMORY_DSN}", "dsnEnv: not read by the sqlite backend (set backend: postgres"),
        (
            "storage: {backend: postgres, dsnEnv: MEMORY_DSN, path: m.db}",
            "path: not read by the postgres backend",
        ),
        (
            "durable: {eventLog: {urlEnv: EVENTS_URL}}",
            "urlEnv: not read by the memory event log (set backend: redis",
        ),
        (
            "mcpServers: {docs: {command: [python, s.py], headers: {Authorization: Bearer t}}}",
            "headers: not read by a stdio (`command`) MCP server",
        ),
        (
            "mcpServers: {docs: {url: 'http://127.0.0.1:1/mcp', env: {A: b}}}",
            "env: not read by a streamable HTTP",
        ),
    ],
)
def test_a_key_of_a_backend_not_chosen_stops_the_start(tmp_path: Path, section: str, named: str) -> None:
    env = {"MEMORY_DSN": "postgresql://nobody@127.0.0.1:1/none", "EVENTS_URL": "redis://127.0.0.1:1/0"}
    assert_refused(tmp_path, f"{section}\n{AGENTS}", env, named)


def test_a_per_key_limit_without_api_keys_stops_the_start(tmp_path: Path) -> None:
    # it served before, the limit applying to no caller (without keys every caller is anonymous)
    named = "PROCMESH_MAX_INFLIGHT_PER_KEY limits each API key, and no API key is configured"
    assert_refused(tmp_path, AGENTS, {"PROCMESH_MAX_INFLIGHT_PER_KEY": "4"}, named)


def test_an_override_naming_two_keys_stops_the_start(tmp_path: Path) -> None:
    # MY_AGENT matches my_agent and myAgent alike: the first was set before, the other left as it was
    agents = "agents: {my_agent: {model: demo}, myAgent: {model: demo}}\n"
    named = "PROCMESH_CONFIG__AGENTS__MY_AGENT__MAX_STEPS: MY_AGENT names 2 keys of agents"
    assert_refused(tmp_path, agents, {"PROCMESH_CONFIG__AGENTS__MY_AGENT__MAX_STEPS": "3"}, named)


def assert_refused(tmp_path: Path, config_text: str, env: dict[str, str], named: str) -> None:
    """`procmesh-orchestrator` on this config and environment exits 2 naming `named`."""
    config = tmp_path / "c.yaml"
    config.write_text(config_text)
    command = [
        str(BIN / "procmesh-orchestrator"),
        "--config",
        str(config),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
    ]
    proc = run(*command, env=env, timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr
