"""Echoed client history (SEED-GAPS O7): a client that resends the conversation with each call
(``useChat``, a chat UI keeping its own list) sends copies of messages the thread already holds,
often under ids of its own. The reference's ``memory-input-filter`` trims them from the input so
the model does not read them twice and memory does not store them again.

Here a copy is recognized by its content, not only by its id (a resent id is one message already:
`RunMessages.prepend`): an input message before the call's last one is dropped when a stored
message of the thread's recent tail has the same role and the same parts (ids and provider
metadata aside). The last input message is always kept: a user may well say the same thing twice.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.run import messages as msgs

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

Message = dict[str, Any]
_NOT_CONTENT = frozenset({"providerMetadata", "providerOptions", "id"})


def content_key(msg: Message) -> tuple[str, str]:
    """What makes two messages the same message to the model: role and parts."""
    content = msg.get("content")
    if isinstance(content, str):
        parts: list[Any] = [{"type": "text", "text": content}]
    else:
        parts = [
            {k: v for k, v in p.items() if k not in _NOT_CONTENT} if isinstance(p, dict) else p
            for p in (content or {}).get("parts") or []
        ]
    return str(msg.get("role")), json.dumps(parts, sort_keys=True, default=str)


def drop_echoes(run: RunCore, stored: list[Message]) -> int:
    """Remove the call's input messages that copy a `stored` message; how many went."""
    inputs = run.ml.view(msgs.INPUT)
    if len(inputs) < 2 or not stored:
        return 0
    known = {content_key(m) for m in stored}
    echoes = [m for m in inputs[:-1] if content_key(m) in known]
    for msg in echoes:
        run.ml.remove(msg["id"])
    return len(echoes)
