"""Where a message part came from: the provider that produced it, a reasoning part's signature,
whether the provider executed a tool call itself (the contract's ``provider``, ``signature`` and
``provider_executed`` fields of parts and prompt parts).

`provider-history-compat` reads them on the prompt to drop what another provider produced and the
call's model cannot take back (another provider's signed reasoning, a search another provider
ran). A part says so with flat keys (``provider``, ``signature``, ``providerExecuted``: what the
conversion from the contract gives) or, as the reference stores them, with ``providerMetadata``
(``{"anthropic": {"signature": ...}}``) and, for reasoning, ``details[].signature``.
"""

from __future__ import annotations

from typing import Any


def part_provenance(part: dict[str, Any], invocation: dict[str, Any] | None = None) -> dict[str, Any]:
    """`part`'s provenance (with its tool `invocation`'s) as flat keys: only those known."""
    inv = invocation or {}
    metadata = part.get("providerMetadata") or inv.get("providerMetadata") or {}
    if not isinstance(metadata, dict):
        metadata = {}
    # "mastra" is the reference's own namespace there (e.g. a tool's modelOutput), not a provider
    provider = part.get("provider") or inv.get("provider") or next((k for k in metadata if k != "mastra"), "")
    out: dict[str, Any] = {}
    if provider:
        out["provider"] = str(provider)
    if part.get("providerExecuted") or inv.get("providerExecuted"):
        out["providerExecuted"] = True
    if part.get("type") == "reasoning":
        signature = part.get("signature") or (metadata.get(provider) or {}).get("signature")
        for detail in part.get("details") or []:
            signature = signature or (detail.get("signature") if isinstance(detail, dict) else None)
        if signature:
            out["signature"] = str(signature)
    return out
