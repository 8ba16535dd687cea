"""What a client reads of a memory store error (issue 24, finding 8): never the store's address
(a SQLite path, a PostgreSQL host, port and database) nor the driver's text; a refused request
keeps its own words."""

from __future__ import annotations

import pytest

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    MemoryStoreError,
    ResumeConflictError,
    StoreUnavailableError,
    SuspendedRunNotFoundError,
    ThreadNotFoundError,
)
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    ResumeRefusedError,
    ServiceError,
    StoreDownError,
    SuspendedRunGoneError,
    resume_error,
)
from procmesh_orchestrator.store import client_message

PG = "postgres:db.internal.example:5432/procmesh"
SQLITE = "sqlite:/var/lib/my data/memory.db"  # a path with a space in it


@pytest.mark.parametrize(
    ("error", "store", "said"),
    [
        (
            StoreUnavailableError(
                f"memory store {PG} is unavailable: reading thread 't1': connection to server at "
                '"10.0.0.7", port 5432 failed: Connection refused'
            ),
            PG,
            "the memory store is unavailable",
        ),
        (
            MemoryStoreError(f'memory store {PG}: saving a turn: relation "threads" does not exist'),
            PG,
            "the memory store failed",
        ),
        (
            MemoryStoreError(f"memory store {SQLITE}: saving a turn: disk I/O error"),
            SQLITE,
            "the memory store failed",
        ),
        (
            InvalidMemoryInputError(f"memory store {SQLITE}: thread 't1': message 1 is 9 bytes"),
            SQLITE,
            "thread 't1': message 1 is 9 bytes",
        ),
        (ThreadNotFoundError(f"memory store {PG}: no thread 't1'"), PG, "no thread 't1'"),
        # without the store's name, a name without spaces is still recognized ...
        (ThreadNotFoundError(f"memory store {PG}: no thread 't1'"), None, "no thread 't1'"),
        # ... and one with spaces is not guessed at: the general words go out instead
        (
            InvalidMemoryInputError(f"memory store {SQLITE}: thread id '' must not be empty"),
            None,
            "the memory store failed",
        ),
    ],
)
def test_a_client_reads_what_happened_never_where_the_store_is(
    error: MemoryStoreError, store: str | None, said: str
) -> None:
    text = client_message(error, store)
    assert text == said
    for secret in ("db.internal.example", "10.0.0.7", "5432", "/var/lib", "relation", "disk I/O"):
        assert secret not in text


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (
            SuspendedRunNotFoundError(f"memory store {PG}: no suspended run 'r1'"),
            SuspendedRunGoneError,
            "no suspended run 'r1'",
        ),
        (
            ResumeConflictError(f"memory store {PG}: suspended run 'r1' was already resumed"),
            ResumeRefusedError,
            "suspended run 'r1' was already resumed",
        ),
        (
            InvalidMemoryInputError(f"memory store {PG}: run id '' must not be empty"),
            BadRequestError,
            "run id '' must not be empty",
        ),
        (
            StoreUnavailableError(f"memory store {PG} is unavailable: claiming: timeout"),
            StoreDownError,
            "the memory store is unavailable",
        ),
        (
            MemoryStoreError(f"memory store {PG}: claiming: syntax error at or near"),
            ServiceError,
            "the memory store failed",
        ),
    ],
)
def test_resuming_answers_without_the_store_s_address(
    error: MemoryStoreError, kind: type[ServiceError], said: str
) -> None:
    answer = resume_error(error)
    assert type(answer) is kind
    assert str(answer) == said
