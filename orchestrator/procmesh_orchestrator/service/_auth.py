"""Bearer API keys, checked the same way on the HTTP and the gRPC API, and who each key is.

Every entry of ``PROCMESH_API_KEYS`` says what its key may do (`parse_keys`):

- ``key=resource``: a tenant key. Its caller acts as that resource (a user, an org) and only that
  one: its runs load and save that resource's threads, and runs, approvals, durable output and the
  memory API show it nothing else.
- ``key=@operator``: acts on every resource's runs, approvals, durable output and threads (the
  explicit read-all, act-all role), and may call the model gateway.
- ``key=@gateway``: the pod's sidecars: the model gateway only (no agent run, no data).

The entry is split at its last ``=``, and only when text follows it, so a base64 key ending in
``=`` padding stays whole (bind one with one more ``=``: ``c2VjcmV0==user-1``). With no key
configured the service is open (development: loopback only unless told otherwise) and every caller
is `ANONYMOUS`, which may do what an operator key may.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.service._errors import AuthenticationError, ForbiddenError
from procmesh_orchestrator.store import MAX_ID_CHARS

OPERATOR = "operator"
"""The role that acts on every resource's runs, approvals, durable output and threads."""
GATEWAY = "gateway"
"""The role of the pod's sidecars: the model gateway and nothing else."""
ROLES = frozenset({OPERATOR, GATEWAY})


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as its API key says."""

    key_id: str
    """A stable, non-secret name of the key for logs, metrics and limits: ``key-3`` (the key's
    1-based position in ``PROCMESH_API_KEYS``), or ``anonymous`` when no key is configured."""
    resource: str | None
    """The resource a tenant key is bound to (None for a role key and for `ANONYMOUS`)."""
    roles: frozenset[str]
    """What a key that is bound to no resource may do: a subset of `ROLES`."""

    @property
    def operator(self) -> bool:
        """True when the caller acts on every resource's runs and data."""
        return OPERATOR in self.roles

    def check_runs_agents(self) -> None:
        """ForbiddenError for a key that may call the model gateway only (the @gateway role)."""
        if self.resource is None and not self.operator:
            raise ForbiddenError(
                "this API key has the gateway role: it may call the model gateway only, not run agents "
                "or read runs and memory"
            )

    def may_see(self, resource: str | None) -> bool:
        """Whether the caller may see and act on a run, approval or thread of `resource`."""
        if self.operator:
            return True
        return self.resource is not None and resource == self.resource


ANONYMOUS = Caller("anonymous", None, frozenset(ROLES))
"""Every caller when no key is configured (open development mode)."""


SIDECAR = Caller("sidecar", None, frozenset({GATEWAY}))
"""The built-in sidecar this process starts (`ApiKeys.sidecar_key`)."""


class KeyListError(ServiceStartError):
    """``PROCMESH_API_KEYS`` cannot be used as it is (the message names the entry, never the key)."""


class RepeatedAuthorizationError(AuthenticationError):
    """Two ``Authorization`` headers (or metadata values): refused, whichever would match."""

    http_status = 400


_HOW = (
    "bind it to a resource ('key=resource'), or give it a role ('key=@operator': every tenant's "
    "runs and data; 'key=@gateway': the model gateway only)"
)


def split_binding(entry: str) -> tuple[str, str | None]:
    """``key=resource`` as (key, resource); an entry without a binding as (entry, None)."""
    key, sep, resource = entry.rpartition("=")
    if not sep or not key or not resource:
        return entry, None
    return key, resource


@dataclass(frozen=True)
class KeyEntry:
    """One entry of ``PROCMESH_API_KEYS``: the key and the caller it identifies."""

    key: str
    caller: Caller


def parse_keys(entries: Sequence[str]) -> tuple[KeyEntry, ...]:
    """Every entry as a key and its caller; `KeyListError` naming the first entry (by its 1-based
    position, never its text) that is empty, holds whitespace or ``;``, binds nothing, names an
    unknown role or an invalid resource, or repeats a key."""
    out: list[KeyEntry] = []
    seen: dict[bytes, int] = {}
    for number, entry in enumerate(entries, 1):
        where = f"PROCMESH_API_KEYS entry {number}"
        if not entry:
            raise KeyListError(f"{where} is empty: separate the entries with one ',' and end with none")
        if ";" in entry or any(ch.isspace() for ch in entry):
            raise KeyListError(
                f"{where} holds whitespace or ';': entries are separated by ',' only "
                "('k1=tenant-a,k2=@gateway') or given as a JSON array"
            )
        key, resource = split_binding(entry)
        if resource is None:
            raise KeyListError(f"{where} is bound to nothing: {_HOW}")
        if resource.startswith("@"):
            role = resource[1:]
            if role not in ROLES:
                raise KeyListError(
                    f"{where}: unknown role {resource[:32]!r} (the roles: @{OPERATOR}, @{GATEWAY})"
                )
            caller = Caller(f"key-{number}", None, frozenset({role}))
        else:
            if len(resource) > MAX_ID_CHARS or not resource.isprintable():
                raise KeyListError(
                    f"{where}: the resource a key is bound to must be a printable id of at most "
                    f"{MAX_ID_CHARS} characters"
                )
            caller = Caller(f"key-{number}", resource, frozenset())
        given = key.encode()
        if given in seen:
            raise KeyListError(
                f"{where} repeats the key of entry {seen[given]}: a key is given once, with one binding"
            )
        seen[given] = number
        out.append(KeyEntry(key, caller))
    return tuple(out)


class ApiKeys:
    """The accepted keys and who each one is; none configured means every caller is `ANONYMOUS`."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._keys = [(e.key.encode(), e.caller) for e in parse_keys([k.get_secret_value() for k in keys])]
        self._sidecar: str | None = None

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self._keys)

    def callers(self) -> list[Caller]:
        """The caller of every configured key, in entry order."""
        return [caller for _, caller in self._keys if caller is not SIDECAR]

    def sidecar_key(self) -> str | None:
        """The key a sidecar this process starts calls the model gateway with: one made for this
        process (random, never shown, the gateway role only: no configured key leaves the process);
        None when no key is configured (the gateway is open then)."""
        if not self._keys:
            return None
        if self._sidecar is None:
            self._sidecar = secrets.token_urlsafe(32)
            self._keys.append((self._sidecar.encode(), SIDECAR))
        return self._sidecar

    def identify(self, authorization: str | list[str] | None) -> Caller:
        """The caller of an ``Authorization`` value of ``Bearer <key>``; AuthenticationError when
        it is missing, malformed, given more than once (a list of values) or not a configured key."""
        if isinstance(authorization, list):
            if len(authorization) > 1:
                raise RepeatedAuthorizationError(
                    "the Authorization header is given more than once: send one 'Authorization: Bearer <key>'"
                )
            authorization = authorization[0] if authorization else None
        if not self._keys:
            return ANONYMOUS
        if not authorization:
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        given = token.encode()
        # Compare with every key (constant time each) so timing says nothing about which one is close.
        found: Caller | None = None
        for key, caller in self._keys:
            if hmac.compare_digest(given, key):
                found = caller
        if found is None:
            raise AuthenticationError("invalid API key")
        return found


def caller_of(request: Any) -> Caller:
    """The caller the HTTP boundary identified (`ANONYMOUS` outside ``/api/*``)."""
    caller = getattr(request.state, "caller", None)
    return caller if isinstance(caller, Caller) else ANONYMOUS


def grpc_caller(keys: ApiKeys, context: Any) -> Caller:
    """The caller of a gRPC call (AuthenticationError as `ApiKeys.identify`): every
    ``authorization`` metadata value counts, so one given twice is refused, never last-wins."""
    given = [v for k, v in context.invocation_metadata() or () if k == "authorization" and isinstance(v, str)]
    return keys.identify(given)
