"""Which store a configuration names, opened: `open_store(config) -> MemoryStore`.

SQLite is the default (``<dataDir>/memory.db``, or an explicit ``path``); PostgreSQL takes its DSN
from the configuration or, better for a password, from the environment variable ``dsnEnv`` names.
The backend modules are imported only when chosen, so a SQLite deployment never loads psycopg.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.store._checks import DEFAULT_MAX_MESSAGE_BYTES
from procmesh_orchestrator.store.contract import MemoryStore

DEFAULT_DATA_DIR = ".procmesh"
"""Where the SQLite file goes when the configuration names no data directory (relative to the cwd)."""


@dataclass(frozen=True)
class StoreConfig:
    """The memory store to open, as the configuration's ``storage`` section describes it."""

    backend: Literal["sqlite", "postgres"] = "sqlite"
    data_dir: str = DEFAULT_DATA_DIR
    """SQLite: the folder of ``memory.db`` (created when missing)."""
    path: str | None = None
    """SQLite: the file itself, overriding `data_dir`."""
    dsn: str | None = None
    """PostgreSQL: a libpq DSN (``postgresql://host/db`` or ``host=... dbname=...``)."""
    dsn_env: str | None = None
    """PostgreSQL: the environment variable holding the DSN (keeps a password out of the file)."""
    min_connections: int = 1
    max_connections: int = 10
    timeout: float = 5.0
    """Seconds: SQLite's busy timeout; PostgreSQL's connect and pool-checkout timeout."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> StoreConfig:
        """From a plain mapping, with the YAML's camelCase keys (``dataDir``) or snake_case ones."""
        names = {f.name for f in fields(cls)}
        known = {_snake(key): value for key, value in values.items()}
        unknown = sorted(key for key in known if key not in names)
        if unknown:
            raise ConfigError(f"storage: unknown key(s) {', '.join(unknown)}")
        return cls(**known)

    def sqlite_path(self) -> Path:
        """The SQLite file this configuration names."""
        return Path(self.path) if self.path else Path(self.data_dir) / "memory.db"

    def postgres_dsn(self, environ: Mapping[str, str] | None = None) -> str:
        """The DSN, from `dsn` or the variable `dsn_env` names; a `ConfigError` when neither gives one."""
        env = os.environ if environ is None else environ
        if self.dsn_env:
            value = env.get(self.dsn_env, "")
            if not value:
                raise ConfigError(f"storage.dsnEnv: the environment variable {self.dsn_env} is not set")
            return value
        if not self.dsn:
            raise ConfigError("storage: the postgres backend needs `dsn` or `dsnEnv`")
        return self.dsn


def open_store(config: StoreConfig | Mapping[str, Any] | Any) -> MemoryStore:
    """The store `config` names, not started yet (``await store.start()`` connects and migrates).

    `config` is a `StoreConfig`, a mapping of its fields, or any object with those attributes (such as
    the configuration schema's section).
    """
    if not isinstance(config, StoreConfig):
        if not isinstance(config, Mapping):
            names = {f.name for f in fields(StoreConfig)}
            config = {name: getattr(config, name) for name in names if hasattr(config, name)}
        config = StoreConfig.from_mapping(config)
    if config.backend == "sqlite":
        from procmesh_orchestrator.store.sqlite import SqliteMemoryStore

        return SqliteMemoryStore(
            config.sqlite_path(), busy_timeout=config.timeout, max_message_bytes=config.max_message_bytes
        )
    if config.backend == "postgres":
        from procmesh_orchestrator.store.postgres import PostgresMemoryStore

        return PostgresMemoryStore(
            config.postgres_dsn(),
            min_connections=config.min_connections,
            max_connections=config.max_connections,
            timeout=config.timeout,
            max_message_bytes=config.max_message_bytes,
        )
    raise ConfigError(f"storage.backend: {config.backend!r} is not a store (sqlite or postgres)")


def _snake(key: str) -> str:
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in key)
