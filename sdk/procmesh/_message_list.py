"""MessageList, apart from the Processor so the hook codecs can use it without an import cycle.

``procmesh.hooks`` builds its table from the codecs (which make a MessageList per request), and
``_processor`` derives its hook names from ``procmesh.hooks``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from procmesh.errors import InvalidInputError

Message = dict[str, Any]


class MessageList:
    """The live message list a hook may edit in place (add, remove, replace).

    Edits are sent back to the orchestrator, which applies them to the run's
    list. `messages` arguments are snapshots; this is the list itself.
    """

    def __init__(self, messages: Iterable[Message]) -> None:
        self._messages = list(messages)
        self.modified = False

    def get_all(self) -> list[Message]:
        """Every message, in order."""
        return list(self._messages)

    def add(self, message: Message) -> None:
        """Append a message (replaces the message with the same id, if any)."""
        self.remove_by_ids([message.get("id", "")])
        self._messages.append(message)
        self.modified = True

    def remove_by_ids(self, ids: Iterable[str]) -> None:
        """Remove the messages with these ids."""
        drop = set(ids)
        kept = [m for m in self._messages if m.get("id") not in drop]
        if len(kept) != len(self._messages):
            self._messages = kept
            self.modified = True

    def replace(self, message: Message) -> None:
        """Replace the message with the same id in place."""
        for i, existing in enumerate(self._messages):
            if existing.get("id") == message.get("id"):
                self._messages[i] = message
                self.modified = True
                return
        raise InvalidInputError(f"message_list.replace: no message with id {message.get('id')!r}")
