"""Attachments that could not be loaded: the placeholder the model sees instead, and the mark that
keeps later turns from trying again (SEED-GAPS D28-D30).

When a provider could not download a file part (``DOWNLOAD_ASSETS_FAILED``, providers/_assets.py)
and neither an error processor nor a fallback model recovered the call, the run does not fail:
`give_up` records the URL under the user message's ``metadata.mastra.unavailableAttachments``,
logs a warning and retries the step once more; `with_placeholders` then shows the model
``[Attachment unavailable: <name>]`` in that file's place. The message keeps its file part, so the
stored thread still holds the attachment; a later turn loading it shows the same placeholder
without downloading again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import APICallError

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)

DOWNLOAD_FAILED = "DOWNLOAD_ASSETS_FAILED"
"""The error id of a failed attachment download (the reference's MastraError id)."""
UNAVAILABLE_KEY = "unavailableAttachments"
"""Under the message's ``metadata.mastra``: the URLs whose download failed for good."""


def attachment_name(part: dict[str, Any]) -> str:
    """What the placeholder calls a file part: its file name, else the URL's last path segment,
    else its media type."""
    if part.get("filename"):
        return str(part["filename"])
    data = part.get("data")
    if isinstance(data, str) and data.startswith(("http://", "https://")):
        segment = data.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if segment and "." in segment:
            return segment
    return str(part.get("mediaType") or "file")


def placeholder(part: dict[str, Any]) -> dict[str, Any]:
    """The text part the model sees instead of a file it cannot have."""
    return {"type": "text", "text": f"[Attachment unavailable: {attachment_name(part)}]"}


def unavailable(msg: dict[str, Any]) -> list[str]:
    """The URLs a message's metadata marks unavailable."""
    metadata = (msg.get("content") or {}).get("metadata") or {}
    urls = (metadata.get("mastra") or {}).get(UNAVAILABLE_KEY) or []
    return [u for u in urls if isinstance(u, str)]


def with_placeholders(msg: dict[str, Any], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user message's prompt parts with its unavailable files as placeholders."""
    marked = set(unavailable(msg))
    if not marked:
        return content
    return [placeholder(p) if p.get("type") == "file" and p.get("data") in marked else p for p in content]


def give_up(run: RunCore, err: APICallError) -> bool:
    """After a DOWNLOAD_ASSETS_FAILED nothing recovered: mark the URL unavailable on the user
    messages holding it and return True (run the step again, with the placeholder); False for any
    other error, or when no message holds the URL (nothing would change)."""
    url = err.details.get("url") if err.error_id == DOWNLOAD_FAILED else None
    if not isinstance(url, str):
        return False
    marked = False
    for msg in run.ml.items:
        if msg.get("role") != "user" or url in unavailable(msg):
            continue
        parts = (msg.get("content") or {}).get("parts") or []
        if not any(p.get("type") == "file" and url in (p.get("data"), p.get("url")) for p in parts):
            continue
        content = msg.setdefault("content", {})
        metadata = content.get("metadata") or {}
        mastra = dict(metadata.get("mastra") or {})
        mastra[UNAVAILABLE_KEY] = [*unavailable(msg), url]
        content["metadata"] = {**metadata, "mastra": mastra}
        marked = True
    if marked:
        log.warning(
            "agent %s: %s; retrying once with the placeholder in its place", run.agent.id, err.message
        )
    return marked
