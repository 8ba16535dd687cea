"""What a client may read of a memory store's error: never where the store is.

The stores name themselves in their errors (``memory store sqlite:/var/lib/procmesh/memory.db:``,
``memory store postgres:HOST:PORT/DB``), and a driver's text can quote a host, a port, a relation:
that belongs in the orchestrator's log, which gets the whole error. A client gets `client_message`:
a refused request (a bad id, a message over the limit, an unknown run) in its own words, without
the store's name, and the store being down or failing in general terms.
"""

from __future__ import annotations

import re

from procmesh_orchestrator.errors import (
    DurableRunExistsError,
    DurableRunNotFoundError,
    InvalidMemoryInputError,
    MemoryStoreError,
    ResumeConflictError,
    StoreUnavailableError,
    SuspendedRunNotFoundError,
    ThreadNotFoundError,
)

_SHOWN = (
    InvalidMemoryInputError,
    ThreadNotFoundError,
    SuspendedRunNotFoundError,
    ResumeConflictError,
    DurableRunNotFoundError,
    DurableRunExistsError,
)
"""Store errors whose text is about the caller's own request (its ids, its sizes), never about the
deployment: a client may read them, without the store's name."""
_STORE_PREFIX = re.compile(r"^memory store \S+: ")


def about_the_request(exc: MemoryStoreError) -> bool:
    """Whether `exc` is about the caller's own request (a bad id, an unknown run), not the store
    failing: the answer tells the caller all of it, and the log need not."""
    return isinstance(exc, _SHOWN)


def client_message(exc: MemoryStoreError, store: str | None = None) -> str:
    """What a client may read of `exc`. `store` is the store's name as its errors start with it;
    without it, a name without spaces is recognized (one with spaces is not guessed at: the general
    words go out instead). The caller logs the whole error: this is only what goes out."""
    if isinstance(exc, _SHOWN):
        text = str(exc)
        prefix = f"memory store {store}: "
        if store and text.startswith(prefix):
            return text[len(prefix) :]
        stripped = _STORE_PREFIX.sub("", text, count=1)
        if stripped != text:
            return stripped
    if isinstance(exc, StoreUnavailableError):
        return "the memory store is unavailable"
    return "the memory store failed"
