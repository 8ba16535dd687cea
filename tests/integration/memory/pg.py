"""A real PostgreSQL server for the memory tests, from the machine's binaries (tests/deps.py).

`initdb` into a temporary folder, then `postgres` listening on a unix socket in that folder only
(``listen_addresses=''``: no TCP port to collide with anything). initdb and postgres refuse to run
as root, so as root both run as `nobody` through setpriv, owning the folder. With
``PROCMESH_TEST_POSTGRES_DSN`` set, that server is used instead and nothing is started.

Each test gets its own schema (`fresh_dsn`): a DSN whose ``search_path`` points at a new, empty
schema, so tests never see each other's tables and need no CREATE DATABASE right.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from tests.deps import require

DSN_ENV = "PROCMESH_TEST_POSTGRES_DSN"
NOBODY = 65534


class PostgresServer:
    """A private postgres process; `dsn` connects to its ``postgres`` database as superuser."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir
        """Where initdb, postgres and pg_ctl are (None: the machine's, found by `require`)."""
        self.folder = Path(tempfile.mkdtemp(prefix="pm-pg-"))
        self.dsn = make_conninfo(host=str(self.folder), port=5432, user="postgres", dbname="postgres")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        initdb = self._program("initdb")
        data = self.folder / "data"
        self.folder.chmod(0o755)
        if os.geteuid() == 0:
            os.chown(self.folder, NOBODY, NOBODY)
        log = (self.folder / "initdb.log").open("wb")
        with log:
            subprocess.run(
                [
                    *self._unprivileged(),
                    initdb,
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                check=True,
                cwd=self.folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
        self.run()

    def run(self) -> None:
        """Start postgres on the initialized folder and wait until it accepts connections."""
        postgres, data = self._program("postgres"), self.folder / "data"
        server_log = (self.folder / "postgres.log").open("ab")
        self._proc = subprocess.Popen(
            [
                *self._unprivileged(),
                postgres,
                "-D",
                str(data),
                "-k",
                str(self.folder),
                "-c",
                "listen_addresses=",
                # The tests kill clients, never this server: skipping fsync only saves time.
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            cwd=self.folder,
            stdout=server_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server_log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.folder / "postgres.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise RuntimeError(f"postgres did not start:\n{tail}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.folder, ignore_errors=True)

    def halt(self) -> None:
        """Stop the server, keeping its data (`run` starts it again)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        # "fast" shutdown: disconnects the clients, rolls back their transactions, then exits.
        subprocess.run(
            [
                *self._unprivileged(),
                self._program("pg_ctl"),
                "stop",
                "-D",
                str(self.folder / "data"),
                "-m",
                "fast",
                "-w",
            ],
            cwd=self.folder,
            capture_output=True,
            timeout=60,
            check=False,
        )
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def _program(self, name: str) -> str:
        return str(self.bindir / name) if self.bindir is not None else require(name)

    def _unprivileged(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) runs initdb and postgres unprivileged"
        return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def fresh_dsn(dsn: str, prefix: str = "t") -> str:
    """A DSN like `dsn` whose tables live in a new, empty schema."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
    return make_conninfo(dsn, options=f"-c search_path={schema}")


def schema_of(dsn: str) -> str:
    """The schema a `fresh_dsn` DSN points at."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        return str(row[0])
