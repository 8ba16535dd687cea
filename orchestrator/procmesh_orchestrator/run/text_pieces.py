"""Text that grows by a stream's deltas (a step's answer, its reasoning, a tool call's arguments)."""

from __future__ import annotations


class Pieces:
    """Text that grows by deltas, joined when read. Adding a delta to a string held by an object
    or a dict copies the whole string each time (CPython resizes in place only a local's): a
    20,000-delta answer cost 76 ms of copies, 1.5 ms kept in pieces."""

    __slots__ = ("_pieces",)

    def __init__(self) -> None:
        self._pieces: list[str] = []

    def add(self, text: str) -> None:
        if text:
            self._pieces.append(text)

    def __str__(self) -> str:
        pieces = self._pieces
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""
