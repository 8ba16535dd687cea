"""Each key of a storage or event-log backend (or an MCP transport) the config does not choose is
a `ConfigError` naming it, through `parse_config`: one left out of the check would be ignored
without a word (`tests/e2e/test_backend_keys.py` starts the real process on one of each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.errors import ConfigError

POSTGRES = {"backend": "postgres", "dsnEnv": "MEMORY_DSN"}
STDIO = {"command": ["python", "s.py"]}
HTTP = {"url": "http://127.0.0.1:1/mcp"}
AGENTS = {"models": {"demo": {"provider": "demo"}}, "agents": {"a": {"model": "demo"}}}


@pytest.mark.parametrize(
    ("section", "named"),
    [
        *[
            ({"storage": {key: value}}, f"{key}: not read by the sqlite backend")
            for key, value in [
                ("dsn", "postgresql://nobody@127.0.0.1:1/none"),
                ("dsnEnv", "MEMORY_DSN"),
                ("minConnections", 2),
                ("maxConnections", 20),
            ]
        ],
        *[
            ({"storage": {**POSTGRES, key: value}}, f"{key}: not read by the postgres backend")
            for key, value in [
                ("dataDir", "data"),
                ("path", "m.db"),
            ]
        ],
        *[
            ({"durable": {"eventLog": {key: value}}}, f"{key}: not read by the memory event log")
            for key, value in [
                ("url", "redis://127.0.0.1:1/0"),
                ("urlEnv", "EVENTS_URL"),
            ]
        ],
        ({"mcpServers": {"docs": {**STDIO, "headers": {"A": "b"}}}}, "headers: not read by a stdio"),
        ({"mcpServers": {"docs": {**HTTP, "env": {"A": "b"}}}}, "env: not read by a streamable HTTP"),
        ({"mcpServers": {"docs": {**HTTP, "cwd": "/tmp"}}}, "cwd: not read by a streamable HTTP"),
    ],
)
def test_each_key_of_a_backend_not_chosen_is_refused(section: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({**section, **AGENTS})
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("section", "read", "expected"),
    [
        ({"storage": {**POSTGRES, "maxConnections": 20}}, lambda c: c.storage.max_connections, 20),
        ({"storage": {"dataDir": "data", "path": "m.db"}}, lambda c: str(c.storage.sqlite_path()), "m.db"),
        (
            {"durable": {"eventLog": {"backend": "redis", "urlEnv": "EVENTS_URL"}}},
            lambda c: c.durable.event_log.url_env,
            "EVENTS_URL",
        ),
        ({"mcpServers": {"docs": {**STDIO, "cwd": "/tmp"}}}, lambda c: c.mcp_servers["docs"].cwd, "/tmp"),
        (
            {"mcpServers": {"docs": {**HTTP, "headers": {"A": "b"}}}},
            lambda c: c.mcp_servers["docs"].headers,
            {"A": "b"},
        ),
    ],
)
def test_the_chosen_backends_keys_are_taken(
    section: dict[str, Any], read: Callable[[Config], Any], expected: Any
) -> None:
    assert read(parse_config({**section, **AGENTS})) == expected
