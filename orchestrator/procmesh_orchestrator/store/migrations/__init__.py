"""Versioned schema migrations, one folder of SQL files per backend (``NNNN_name.sql``).

Each store applies, at start-up, the migrations above the highest version in its ``schema_version``
table, each once and in one transaction with its version row, under a lock that serializes
concurrent start-ups (SQLite's write lock, a PostgreSQL advisory lock). Migrations are additive
(new tables, columns with defaults, indexes), so a replica not yet upgraded keeps running on a
schema one version ahead of it during a rolling deploy: it logs that, and does not refuse.

One is not: 0005 scopes thread ids by resource, rekeying threads and messages (and renaming the
thread's ``id`` column to ``thread_id``). A replica of an older build fails every memory read and
write on that schema, by design, rather than read another resource's thread by its unscoped id
(docs/deploy.md says how to roll across it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from procmesh_orchestrator.errors import MemoryStoreError

Backend = Literal["sqlite", "postgres"]

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One versioned schema change."""

    version: int
    name: str
    sql: str


def migrations(backend: Backend) -> list[Migration]:
    """The backend's migrations in version order; versions must run 1, 2, 3 ... without a gap."""
    found = []
    for entry in (resources.files(__package__) / backend).iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MemoryStoreError(f"{backend} migrations must be numbered 1..N without gaps, found {versions}")
    return found
