"""Bearer API keys, checked the same way on the HTTP and the gRPC API.

A key may be bound to a resource (a user, an org): the entry ``key=resource`` in
``PROCMESH_API_KEYS``. A caller with a bound key acts as that resource and only that one: its runs
load and save that resource's threads, and the memory API shows it nothing else. The entry is split
at its last ``=``, and only when text follows it, so a base64 key ending in ``=`` padding stays a
plain key (bind one with one more ``=``: ``c2VjcmV0==user-1``).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from pydantic import SecretStr

from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.memory._common import MAX_ID_CHARS
from procmesh_orchestrator.service._errors import AuthenticationError


def split_binding(entry: str) -> tuple[str, str | None]:
    """``key=resource`` as (key, resource); an entry without a binding as (entry, None)."""
    key, sep, resource = entry.rpartition("=")
    if not sep or not key or not resource:
        return entry, None
    if len(resource) > MAX_ID_CHARS or not resource.isprintable():
        raise ServiceStartError(
            f"PROCMESH_API_KEYS: the resource a key is bound to must be a printable id of at most "
            f"{MAX_ID_CHARS} characters"
        )
    return key, resource


class ApiKeys:
    """The accepted keys and the resource each is bound to; none configured means every caller is accepted."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._keys = [
            (key.encode(), resource)
            for key, resource in (split_binding(entry.get_secret_value()) for entry in keys)
        ]

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self._keys)

    def check(self, authorization: str | None) -> str | None:
        """Accept an ``Authorization`` value of ``Bearer <key>`` (AuthenticationError otherwise) and
        return the resource that key is bound to, if any."""
        if not self._keys:
            return None
        if not authorization:
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        given = token.encode()
        # Compare with every key (constant time each) so timing says nothing about which one is close.
        matched = False
        bound: str | None = None
        for key, resource in self._keys:
            same = hmac.compare_digest(given, key)
            matched |= same
            if same:
                bound = resource
        if not matched:
            raise AuthenticationError("invalid API key")
        return bound
