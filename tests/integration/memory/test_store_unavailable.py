"""A store that is down, locked or unreadable gives a clear error naming it, and never a half turn;
`open_store` picks the backend the configuration names."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError, MemoryStoreError, StoreUnavailableError
from procmesh_orchestrator.store import StorageConfig, open_store
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.integration.memory.pg import PostgresServer, fresh_dsn
from tests.integration.memory.test_store_contract import ids, msg

# --- SQLite ---------------------------------------------------------------------------------------


async def test_sqlite_folder_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    store = SqliteMemoryStore(tmp_path / "file" / "memory.db")
    with pytest.raises(StoreUnavailableError, match=r"memory store sqlite:.*/file/memory\.db"):
        await store.start()


async def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "memory.db").write_bytes(b"garbage" * 1000)
    store = SqliteMemoryStore(tmp_path / "memory.db")
    with pytest.raises(StoreUnavailableError, match="file is not a database"):
        await store.start()


async def test_sqlite_locked_past_the_busy_timeout_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "memory.db", busy_timeout=0.2)
    await store.start()
    try:
        await store.save_turn("t1", "alice", [msg("u1")])
        other = sqlite3.connect(tmp_path / "memory.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            with pytest.raises(
                StoreUnavailableError, match="saving a turn to thread 't1': database is locked"
            ):
                await store.save_turn("t1", "alice", [msg("u2"), msg("a2", "assistant")])
        finally:
            other.execute("ROLLBACK")
            other.close()
        await store.save_turn("t1", "alice", [msg("u3")])
        assert ids(await store.messages("t1", "alice")) == ["u1", "u3"]
    finally:
        await store.close()


async def test_sqlite_waits_for_a_short_lock_instead_of_failing(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "memory.db", busy_timeout=5)
    await store.start()
    other = sqlite3.connect(tmp_path / "memory.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        saving = asyncio.ensure_future(store.save_turn("t1", "alice", [msg("u1")]))
        await asyncio.sleep(0.3)
        assert not saving.done()  # waiting on the busy timeout
        other.execute("ROLLBACK")
        await saving
        assert ids(await store.messages("t1", "alice")) == ["u1"]
    finally:
        other.close()
        await store.close()


async def test_sqlite_uses_wal_and_foreign_keys(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "memory.db")
    await store.start()
    await store.close()
    with sqlite3.connect(tmp_path / "memory.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # persistent in the file


# --- PostgreSQL -----------------------------------------------------------------------------------


async def test_postgres_that_is_not_there_is_unavailable_without_the_password(tmp_path: Path) -> None:
    dsn = f"postgresql://memuser:s3cret-pw@/procmesh?host={tmp_path}&port=5999"
    store = PostgresMemoryStore(dsn, timeout=1)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.start()
    text = str(caught.value)
    assert text.startswith(f"memory store postgres:{tmp_path}:5999/procmesh is unavailable: connecting")
    assert "s3cret-pw" not in text
    assert "memuser" not in text


def test_a_malformed_dsn_is_refused_without_echoing_it() -> None:
    with pytest.raises(MemoryStoreError) as caught:
        PostgresMemoryStore("host=x password='unterminated")
    assert "unterminated" not in str(caught.value)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of this test's own, that it may stop and start again."""
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


async def test_postgres_going_down_and_coming_back(own_server: PostgresServer) -> None:
    dsn = fresh_dsn(own_server.dsn)
    store = PostgresMemoryStore(dsn, timeout=1, max_connections=2)
    await store.start()
    try:
        await store.save_turn("t1", "alice", [msg("u1")])
        await asyncio.to_thread(own_server.halt)
        with pytest.raises(
            StoreUnavailableError, match=r"memory store postgres:.* is unavailable: saving a turn"
        ):
            await store.save_turn("t1", "alice", [msg("u2")])
        with pytest.raises(StoreUnavailableError):
            await store.messages("t1", "alice")
        await asyncio.to_thread(own_server.run)
        # The pool reconnects by itself (with its backoff): the first saves may still find it down.
        for _ in range(100):
            try:
                await store.save_turn("t1", "alice", [msg("u3")])
                break
            except StoreUnavailableError:
                await asyncio.sleep(0.2)
        assert ids(await store.messages("t1", "alice")) == ["u1", "u3"]
    finally:
        await store.close()


async def test_postgres_connections_killed_under_the_store_are_replaced(postgres_dsn: str) -> None:
    store = PostgresMemoryStore(fresh_dsn(postgres_dsn), max_connections=3)
    await store.start()
    try:
        await store.save_turn("t1", "alice", [msg("u1")])
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        await store.save_turn("t1", "alice", [msg("u2")])  # checked on checkout, reconnected
        assert ids(await store.messages("t1", "alice")) == ["u1", "u2"]
    finally:
        await store.close()


# --- open_store ------------------------------------------------------------------------------------


async def test_open_store_defaults_to_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    store = open_store({"dataDir": str(tmp_path / "data")})
    assert isinstance(store, SqliteMemoryStore)
    assert store.path == tmp_path / "data" / "memory.db"
    await store.start()
    await store.save_turn("t1", "alice", [msg("u1")])
    await store.close()
    assert (tmp_path / "data" / "memory.db").exists()
    explicit = open_store(StorageConfig(path=str(tmp_path / "x.db")))
    assert isinstance(explicit, SqliteMemoryStore)
    assert explicit.path == tmp_path / "x.db"


async def test_open_store_postgres_from_an_environment_variable(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PM_TEST_MEMORY_DSN", fresh_dsn(postgres_dsn))
    store = open_store({"backend": "postgres", "dsnEnv": "PM_TEST_MEMORY_DSN", "maxConnections": 2})
    assert isinstance(store, PostgresMemoryStore)
    await store.start()
    await store.save_turn("t1", "alice", [msg("u1")])
    assert ids(await store.messages("t1", "alice")) == ["u1"]
    await store.close()


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"backend": "postgres"}, "the postgres backend needs dsnEnv .* or dsn"),
        ({"backend": "postgres", "dsnEnv": "PM_TEST_SURELY_UNSET"}, "PM_TEST_SURELY_UNSET is not set"),
        ({"backend": "mysql"}, "storage: backend: Input should be 'sqlite' or 'postgres'"),
        ({"dataDirr": "x"}, "storage: dataDirr: Extra inputs are not permitted"),
        ({"data_dir": "x", "maxConnections": 0}, "storage: maxConnections: Input should be greater"),
    ],
)
def test_open_store_configuration_errors(config: dict[str, str], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        open_store(config)


def test_open_store_takes_the_configuration_schemas_section(tmp_path: Path) -> None:
    config = parse_config({"agents": {}, "storage": {"backend": "sqlite", "dataDir": str(tmp_path)}})
    store = open_store(config.storage)
    assert isinstance(store, SqliteMemoryStore)
    assert store.path == tmp_path / "memory.db"
