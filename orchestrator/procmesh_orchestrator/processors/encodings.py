"""A run's messages encoded once: each message dict's protobuf bytes, reused while it is unchanged.

A run sends the same messages to every processor of a lane and again at every step, and most
processors hand them back untouched, so converting each dict to protobuf for every call (8 of the
10 µs of building a `processInputStep` request of 4 messages, bench P1) repeats the same work.
The dicts are mutable and some are changed in place (a tool result settling its call), so a
cached encoding is used only while the dict still equals a snapshot taken when it was encoded.
The snapshot copies the containers and wraps every number and boolean so that it equals only a
value of the same type: plain ``==`` would find ``True`` equal to ``1`` and ``1`` to ``1.0``,
which the conversion tells apart (a bool becomes ``bool_value``). Strings and bytes are shared,
which makes comparing them an identity check.

The request itself goes as bytes (`encode`): its other fields serialized, then the messages'
encodings, each framed as its field. Merging them into a request message first (and gRPC
serializing it all again) parsed and re-encoded every message on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from procmesh import convert

Message = dict[str, Any]
Fill = Callable[[Any, str, list[Message]], None]
"""(request, a repeated ``Message`` field's name, message dicts) -> adds them to that field."""

_DICT_EQ: Any = dict.__eq__

_PRUNE_SLACK = 64
"""Entries kept beyond twice the messages of the last build before the cache is pruned."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(number: int, data: bytes) -> bytes:
    """`data` framed as the length-delimited field `number` of a message (appended to a message's
    bytes, it sets that submessage field, or adds an element to that repeated field)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


class _Typed:
    """A number or boolean in a snapshot: equal only to a value of the same type and value."""

    __slots__ = ("value",)

    def __init__(self, value: bool | int | float) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self.value) and other == self.value

    __hash__ = None  # type: ignore[assignment]


class _Uncacheable(Exception):
    """A value the snapshot cannot vouch for (not JSON-shaped): its message is encoded each time."""


def _snapshot(value: Any) -> Any:
    """A copy of `value` that stays equal to it (``==``) exactly while its conversion would not
    change: containers copied, numbers and booleans typed, strings and bytes shared."""
    kind = type(value)
    if kind is str or kind is bytes or value is None:
        return value
    if kind is bool or kind is int or kind is float:
        return _Typed(value)
    if isinstance(value, dict) and kind.__eq__ is _DICT_EQ:
        return {k: _snapshot(v) for k, v in value.items()}
    if kind is list:
        return [_snapshot(v) for v in value]
    if kind is tuple:
        return tuple(_snapshot(v) for v in value)
    if kind is bytearray:
        return bytes(value)  # equal to the bytearray while its contents are, encoded the same
    raise _Uncacheable(kind.__name__)


class MessageEncodings:
    """Per run: the encoding of each message dict it sent, reused while the dict is unchanged.

    Entries hold their dict (so its ``id`` is not reused while cached); once there are more than
    twice as many as the last request sent (rewritten messages left behind), the cache keeps only
    that request's (`encode`).
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Message, Any, bytes]] = {}
        self._tags: dict[tuple[str, str], bytes] = {}
        self._frames: list[bytes] = [b""]
        """The request's own fields (set by `encode`), then the messages `fill` added."""
        self._sent: list[list[Message]] = []
        self._count = 0

    def _framed(self, msg: Message) -> bytes:
        """`msg` as serialized ``procmesh.v1.Message`` bytes, after their length."""
        entry = self._by_id.get(id(msg))
        if entry is not None and entry[0] is msg and msg == entry[1]:
            return entry[2]
        data = convert.message_to_proto(msg).SerializeToString()
        framed = _varint(len(data)) + data
        try:
            self._by_id[id(msg)] = (msg, _snapshot(msg), framed)
        except _Uncacheable:
            self._by_id.pop(id(msg), None)
        return framed

    def fill(self, request: Any, field: str, messages: list[Message]) -> None:
        """Add `messages` to the repeated ``Message`` field `field` of `request`, in the bytes
        `encode` gives for it (each message's encoding framed as that field)."""
        if not messages:
            return
        key = (request.DESCRIPTOR.full_name, field)
        tag = self._tags.get(key)
        if tag is None:
            number = request.DESCRIPTOR.fields_by_name[field].number
            tag = self._tags[key] = _varint(number << 3 | 2)  # wire type 2: length-delimited
        frames = self._frames
        for msg in messages:
            frames += (tag, self._framed(msg))
        self._sent.append(messages)
        self._count += len(messages)

    def encode(self, request: Any, build: Callable[[Fill], None]) -> bytes:
        """`request` as `build` fills it, serialized: `build` is given `fill`, which adds messages
        by their kept encodings. Then the cache keeps only this request's entries if the others
        are many."""
        frames = self._frames
        del frames[1:]  # what a build that raised left
        self._sent.clear()
        self._count = 0
        build(self.fill)
        frames[0] = request.SerializeToString()
        data = b"".join(frames)
        if len(self._by_id) > 2 * self._count + _PRUNE_SLACK:
            sent = {id(m) for messages in self._sent for m in messages}
            self._by_id = {k: v for k, v in self._by_id.items() if k in sent}
        return data
