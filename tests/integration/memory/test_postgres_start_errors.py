"""A PostgreSQL store that cannot connect at start says why (issue 24, finding 8): a wrong password,
user, database, socket or port each named, where all of them said "pool initialization incomplete".

Against a real private PostgreSQL (`tests.integration.memory.pg`), with one role that logs in by
password (a ``scram-sha-256`` line put first in its pg_hba.conf).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from procmesh_orchestrator.errors import StoreUnavailableError
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from tests.integration.memory.pg import PostgresServer

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

PASSWORD = "right-pw-0123"
WRONG = "wrong-pw-4567"


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE pwuser LOGIN PASSWORD '{PASSWORD}'")
        conn.execute("CREATE DATABASE pwdb OWNER pwuser")
        hba = server.folder / "data" / "pg_hba.conf"
        hba.write_text("local all pwuser scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while True:  # the reload is asynchronous: wait until the password is asked for
        try:
            psycopg.connect(
                make_conninfo(server.dsn, user="pwuser", password=WRONG), connect_timeout=2
            ).close()
        except psycopg.OperationalError:
            break
        assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
        time.sleep(0.1)
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user": "pwuser", "password": WRONG}, "the server refused the password of the DSN's user"),
        ({"user": "ghost"}, "the DSN's user does not exist on the server"),
        (
            {"user": "pwuser", "password": PASSWORD, "dbname": "nope"},
            "the DSN's database does not exist on the server",
        ),
        ({"port": 5433}, "no server socket at that path and port"),
        ({"host": "127.0.0.1", "port": 1}, "connection refused: nothing listens at that host and port"),
    ],
)
async def test_a_store_that_cannot_connect_at_start_says_which_setting_is_wrong(
    server: PostgresServer, change: dict[str, object], reason: str
) -> None:
    store = PostgresMemoryStore(make_conninfo(server.dsn, **change), timeout=1.0)
    with pytest.raises(StoreUnavailableError) as error:
        await store.start()
    message = str(error.value)
    assert message.startswith(f"memory store {store.name} is unavailable: connecting: {reason} (")
    assert "pool initialization incomplete" not in message
    assert WRONG not in message


async def test_the_right_password_connects(server: PostgresServer) -> None:
    dsn = make_conninfo(server.dsn, user="pwuser", password=PASSWORD, dbname="pwdb")
    store = PostgresMemoryStore(dsn, timeout=2.0)
    await store.start()
    try:
        assert await store.get_thread("t-1", "user-1") is None
    finally:
        await store.close()
