"""MessageList, apart from the Processor so the hook codecs can use it without an import cycle.

``procmesh.hooks`` builds its table from the codecs (which make a MessageList per request), and
``_processor`` derives its hook names from ``procmesh.hooks``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from procmesh.errors import InvalidInputError

Message = dict[str, Any]


class View(NamedTuple):
    """One read view of the list: ``db()`` gives its messages, in order (the seeds' ``.db()``)."""

    db: Callable[[], list[Message]]


class Views(NamedTuple):
    """The seeds' ``messageList.get``: ``all``, and each source's messages (`MessageList.get`)."""

    all: View
    input: View
    """This call's input (and signals)."""
    response: View
    """What this run's steps and hooks added (the model's answers, tool results)."""
    remembered: View
    """History loaded from the memory thread."""


_SOURCE_OF_VIEW = {"input": "input", "response": "response", "remembered": "memory"}


class MessageList:
    """The live message list a hook may edit in place (add, remove, replace).

    Edits are sent back to the orchestrator, which applies them to the run's
    list. `messages` arguments are snapshots; this is the list itself.

    `sources` is where each message came from, by id (``RunContext.message_sources``); a message
    the orchestrator sent without one is ``input``. A message this hook adds is in ``get.all``
    only: the orchestrator files it (the next hook sees its source).
    """

    def __init__(self, messages: Iterable[Message], sources: Mapping[str, str] | None = None) -> None:
        self._messages = list(messages)
        self.modified = False
        given = dict(sources or {})
        self._sources = {str(m.get("id")): given.get(str(m.get("id")), "input") for m in self._messages}

    def get_all(self) -> list[Message]:
        """Every message, in order."""
        return list(self._messages)

    @property
    def get(self) -> Views:
        """The read views: ``get.all.db()``, ``get.input.db()``, ``get.response.db()``,
        ``get.remembered.db()`` (each a new list, in the list's order)."""

        def of(view: str) -> View:
            source = _SOURCE_OF_VIEW[view]
            return View(lambda: [m for m in self._messages if self._sources.get(str(m.get("id"))) == source])

        return Views(View(self.get_all), of("input"), of("response"), of("remembered"))

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
