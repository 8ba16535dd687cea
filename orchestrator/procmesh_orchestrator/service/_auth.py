"""Bearer API keys, checked the same way on the HTTP and the gRPC API."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from pydantic import SecretStr

from procmesh_orchestrator.service._errors import AuthenticationError


class ApiKeys:
    """The accepted keys; none configured means every caller is accepted."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._keys = [key.get_secret_value().encode() for key in keys]

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self._keys)

    def check(self, authorization: str | None) -> None:
        """Accept an ``Authorization`` value of ``Bearer <key>``; raise AuthenticationError otherwise."""
        if not self._keys:
            return
        if not authorization:
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        given = token.encode()
        # Compare with every key (constant time each) so timing says nothing about which one is close.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(given, key)
        if not matched:
            raise AuthenticationError("invalid API key")
