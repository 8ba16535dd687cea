"""Which store a configuration names, opened: `open_store(config) -> MemoryStore`.

`StorageConfig` is the configuration's ``storage`` section, the one type that describes the store
(the YAML schema takes it from here). SQLite is the default (``<dataDir>/memory.db``, or an
explicit ``path``); PostgreSQL takes its DSN from the configuration or, better for a password, from
the environment variable ``dsnEnv`` names. The backend modules are imported only when chosen, so a
SQLite deployment never loads psycopg.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.store.contract import MemoryStore

DEFAULT_DATA_DIR = ".procmesh"
"""Where the SQLite file goes when the configuration names no data directory (relative to the cwd)."""


_POSTGRES_ONLY = frozenset({"dsn", "dsn_env", "min_connections", "max_connections"})
_SQLITE_ONLY = frozenset({"data_dir", "path"})


class StorageConfig(BaseModel):
    """Where memory lives: an embedded SQLite file (the default) or PostgreSQL (several replicas)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    backend: Literal["sqlite", "postgres"] = "sqlite"
    data_dir: str = DEFAULT_DATA_DIR
    """SQLite: the folder of ``memory.db`` (created when missing; relative to the working directory)."""
    path: str | None = None
    """SQLite: the file itself, instead of ``<dataDir>/memory.db``."""
    dsn_env: str | None = None
    """PostgreSQL: the environment variable holding the DSN (the password stays out of the file)."""
    dsn: str | None = None
    """PostgreSQL: the DSN itself (prefer `dsnEnv` when it holds a password)."""
    min_connections: int = Field(default=1, ge=1)
    max_connections: int = Field(default=10, ge=1)
    timeout: float = Field(default=5.0, gt=0)
    """Seconds: SQLite's busy timeout; PostgreSQL's connect and pool-checkout timeout."""

    @model_validator(mode="after")
    def _postgres(self) -> StorageConfig:
        if self.backend == "postgres" and not (self.dsn or self.dsn_env):
            raise ValueError("the postgres backend needs dsnEnv (an environment variable) or dsn")
        # a key of the other backend would be ignored: replicas meant to share PostgreSQL would
        # each run on a SQLite file of their own, without a word
        given = self.model_fields_set
        other = _POSTGRES_ONLY if self.backend == "sqlite" else _SQLITE_ONLY
        if ignored := sorted(to_camel(name) for name in other & given):
            raise ValueError(
                f"{', '.join(ignored)}: not read by the {self.backend} backend"
                + (" (set backend: postgres to use PostgreSQL)" if self.backend == "sqlite" else "")
            )
        return self

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


def open_store(config: StorageConfig | Mapping[str, Any]) -> MemoryStore:
    """The store `config` names, not started yet (``await store.start()`` connects and migrates).

    `config` is a `StorageConfig` (the configuration's ``storage`` section) or a mapping of its
    keys, camelCase (``dataDir``) or snake_case; a mapping it refuses is a `ConfigError` naming
    the key.
    """
    if not isinstance(config, StorageConfig):
        try:
            config = StorageConfig.model_validate(config)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigError(f"storage: {problems}") from None
    if config.backend == "sqlite":
        from procmesh_orchestrator.store.sqlite import SqliteMemoryStore

        return SqliteMemoryStore(config.sqlite_path(), busy_timeout=config.timeout)
    from procmesh_orchestrator.store.postgres import PostgresMemoryStore

    return PostgresMemoryStore(
        config.postgres_dsn(),
        min_connections=config.min_connections,
        max_connections=config.max_connections,
        timeout=config.timeout,
    )
