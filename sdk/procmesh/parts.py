"""Message parts as plain dicts, without the wire (no protobuf is imported): the run loop and
the service use these as the SDK's conversions do.

- Where a part came from: the provider that produced it, a reasoning part's signature, whether
  the provider executed a tool call itself (the contract's ``provider``, ``signature`` and
  ``provider_executed`` fields of parts and prompt parts). `provider-history-compat` reads them on
  the prompt to drop what another provider produced and the call's model cannot take back
  (another provider's signed reasoning, a search another provider ran). A part says so with flat
  keys (``provider``, ``signature``, ``providerExecuted``: what the conversion from the contract
  gives) or, as the reference stores them, with ``providerMetadata`` (``{"anthropic":
  {"signature": ...}}``) and, for reasoning, ``details[].signature``.
- The legacy flattened ``content.content`` string (the seeds' fallback for a hook or an older
  client that sets only that).
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


def flat_text(parts: list[dict[str, Any]]) -> str:
    """The legacy flattened ``content.content``: the text parts joined with newlines."""
    return "\n".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


def with_flat_text(content: dict[str, Any]) -> list[dict[str, Any]]:
    """A content's parts; a content whose only text is the legacy flattened ``content.content``
    string gets it as a text part (the reference's fallback: a hook or an older client may set
    only that)."""
    parts = list(content.get("parts") or [])
    flat = content.get("content")
    if isinstance(flat, str) and flat and not any(p.get("type") == "text" for p in parts):
        parts.append({"type": "text", "text": flat})
    return parts
