"""Which caller may send which request-context keys (``PROCMESH_TRUSTED_CONTEXT``), per key.

A request's ``requestContext`` reaches processors, so a key in it is a claim only some callers may
make: the setting maps a tenant's resource (the keys bound to it), ``@operator`` (keys with that
role, and every caller when no key is configured) or ``*`` (every caller) to the context keys they
may send (``*``: every key that is not reserved). A caller gets the union of its entries.

Reserved keys select whose data a run touches: a thread, a resource, a response-cache scope or
entry (``threadId``, ``resourceId``, ``mastra__threadId``, ``mastra__resourceId``,
``responseCache``, ``mastra__response_cache_context``). They never come from a caller, whatever
its trust: the server sets the thread and the resource (the key's binding), and the response
cache scopes its entries by that resource. A request that sends a reserved key, or a key its
caller is not trusted for, is refused (400) naming them: nothing is dropped silently.

``PROCMESH_UNTRUSTED_CONTEXT=drop`` lets an agent call (generate, stream) go on without the keys
its caller is not trusted for instead (`ContextTrust.admit`; and without those its agent's
requestContextSchema does not declare: `AgentCall.drop_undeclared`), never silently: the response
names them (`DROPPED_HEADER`), a WARNING names them and a counter counts the call (`report_dropped`).
Reserved keys are refused even then: a caller sending one is trying to act on another's thread,
resource or cache scope, which a run without it would hide from the caller instead of stopping.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from prometheus_client import Counter

from procmesh_orchestrator.run.context import RESERVED_KEYS
from procmesh_orchestrator.run.context import names as key_names
from procmesh_orchestrator.service._auth import GATEWAY, OPERATOR, ROLES, Caller, KeyListError
from procmesh_orchestrator.service._errors import BadRequestError

log = logging.getLogger(__name__)

ANY = "*"
"""As an entry: every caller; in an entry's list: every key that is not reserved."""
RESERVED = RESERVED_KEYS
"""Context keys that select a thread, a resource or a cache scope: never a caller's (nor a
hook's: `run.context`)."""


DROPPED_HEADER = "X-Procmesh-Dropped-Context"
"""The response header (over gRPC: the initial metadata key, lower case) naming dropped keys."""
_HEADER_KEYS = 32
"""Keys the header names at most (then ``+N``): a caller choosing the keys chooses the header."""


class TrustedContextError(KeyListError):
    """``PROCMESH_TRUSTED_CONTEXT`` cannot be used as it is (the message names the entry)."""


@dataclass(frozen=True)
class ContextTrust:
    """The parsed setting: per entry (a resource, ``@operator`` or ``*``), the keys it may send."""

    entries: Mapping[str, frozenset[str]]
    drop: bool = False
    """``PROCMESH_UNTRUSTED_CONTEXT=drop``: `admit` drops the keys a caller is not trusted for."""

    @classmethod
    def of(
        cls,
        setting: Mapping[str, list[str]],
        callers: Iterable[Caller],
        *,
        legacy: bool,
        drop: bool = False,
    ) -> ContextTrust:
        """Check the setting against the configured keys (`TrustedContextError` naming the entry);
        `legacy` is the deprecated ``PROCMESH_TRUST_REQUEST_CONTEXT=true``: ``{"*": ["*"]}``."""
        resources = {c.resource for c in callers if c.resource is not None}
        entries: dict[str, frozenset[str]] = {}
        for who, names in setting.items():
            where = f"PROCMESH_TRUSTED_CONTEXT entry {who[:64]!r}"
            if who.startswith("@"):
                if who[1:] not in ROLES:
                    raise TrustedContextError(f"{where}: unknown role (trust @{OPERATOR}, a resource or '*')")
                if who[1:] == GATEWAY:
                    raise TrustedContextError(f"{where}: a @{GATEWAY} key runs no agent, so sends no context")
            elif who != ANY and who not in resources:
                raise TrustedContextError(f"{where}: no key of PROCMESH_API_KEYS is bound to that resource")
            reserved = RESERVED.intersection(names)
            if reserved:
                raise TrustedContextError(
                    f"{where}: {key_names(reserved)} reserved: a thread, a resource or a cache scope never "
                    "comes from a caller"
                )
            if any(not name for name in names):
                raise TrustedContextError(f"{where}: an empty key name")
            entries[who] = frozenset(names)
        if legacy:
            log.warning(
                "PROCMESH_TRUST_REQUEST_CONTEXT is deprecated: it trusts every caller for every "
                "request-context key that is not reserved; say so with "
                'PROCMESH_TRUSTED_CONTEXT={"*": ["*"]}, or trust per key'
            )
            entries[ANY] = frozenset({ANY})
        return cls(entries, drop)

    def allowed(self, caller: Caller) -> frozenset[str]:
        """The keys `caller` may send (`ANY` among them: every key that is not reserved)."""
        out: set[str] = set(self.entries.get(ANY, ()))
        if caller.resource is not None:
            out |= self.entries.get(caller.resource, frozenset())
        for role in caller.roles:
            out |= self.entries.get(f"@{role}", frozenset())
        return frozenset(out)

    def check(self, caller: Caller, context: Any, where: str = "requestContext") -> dict[str, Any]:
        """`context` when `caller` may send every key in it; a 400 naming the keys otherwise, in
        either mode (a route whose response could not name dropped keys refuses them)."""
        return self._screen(caller, context, where, drop=False)[0]

    def admit(
        self, caller: Caller, context: Any, where: str = "requestContext"
    ) -> tuple[dict[str, Any], list[str]]:
        """An agent call's context as `check` takes it, but in drop mode without the keys `caller`
        is not trusted for; those keys (sorted) are the second item, for the response to name."""
        return self._screen(caller, context, where, drop=self.drop)

    @staticmethod
    def check_reserved(context: Any, where: str = "requestContext") -> dict[str, Any]:
        """`context` (an object, or None: empty) without a reserved key: a 400 naming them. No
        caller sends those, whatever else it may send."""
        if context is None:
            return {}
        if not isinstance(context, dict):
            raise BadRequestError(f"{where}: must be an object")
        reserved = RESERVED.intersection(context)
        if reserved:
            raise BadRequestError(
                f"{where}: {key_names(reserved)} reserved: the server sets the thread, the resource and the "
                "cache scope (the API key's resource), never the caller"
            )
        return context

    def _screen(
        self, caller: Caller, context: Any, where: str, *, drop: bool
    ) -> tuple[dict[str, Any], list[str]]:
        context = self.check_reserved(context, where)
        if not context:
            return context, []
        allowed = self.allowed(caller)
        if ANY in allowed:
            return context, []
        refused = set(context) - allowed
        if not refused:
            return context, []
        if drop:
            return {k: v for k, v in context.items() if k in allowed}, sorted(refused)
        raise BadRequestError(
            f"{where}: this API key may not send {key_names(refused)} (PROCMESH_TRUSTED_CONTEXT says "
            "which keys each caller may send)"
        )


def dropped_header(keys: list[str]) -> str:
    """`DROPPED_HEADER`'s value: the keys percent-encoded (ASCII whatever the caller sent, and no
    comma inside a name), comma-separated, the first `_HEADER_KEYS` then ``+N`` for the rest."""
    shown = ", ".join(quote(k, safe="") for k in keys[:_HEADER_KEYS])
    return shown + (f", +{len(keys) - _HEADER_KEYS}" if len(keys) > _HEADER_KEYS else "")


def report_dropped(counter: Counter, api: str, agent_id: str, keys: list[str]) -> None:
    """Count an agent call run without `keys` and log one WARNING naming them (the counter's
    labels stay bounded: the agent is a configured one, the keys are the caller's)."""
    counter.labels(agent_id).inc()
    log.warning(
        "%s agent=%s: requestContext %s dropped (PROCMESH_UNTRUSTED_CONTEXT=drop): the caller is not "
        "trusted for them (PROCMESH_TRUSTED_CONTEXT) or the agent does not declare them "
        "(requestContextSchema)",
        api,
        agent_id,
        key_names(keys),
    )
