"""What the server does with input it refuses: decode it itself, answer briefly, log once in a while.

grpc.aio's own deserializer turns an undecodable request into UNKNOWN and an ERROR traceback per
call, so anyone who can reach the port can flood the log. The handlers therefore take raw bytes
and decode them here: a request that does not decode is INVALID_ARGUMENT (the contract's code for
a malformed request), and refusals are logged as one WARNING per interval with a count, never with
the request's content above DEBUG. Messages sent back are bounded too: an id is echoed at most
`ID_CHARS` characters long and any detail at most `DETAIL_CHARS`, so a huge field cannot turn the
answer into RESOURCE_EXHAUSTED (status details travel in an 8 KiB metadata budget).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from procmesh.errors import InvalidInputError

log = logging.getLogger(__name__)

ID_CHARS = 64
"""The longest id an error message echoes."""
DETAIL_CHARS = 1024
"""The longest status detail the server sends."""
WARN_INTERVAL = 10.0
"""Seconds between two WARNINGs about refused requests."""
MALFORMED = (ValueError, TypeError, KeyError, RecursionError, json_format.Error)
"""What a hook's decoder raises for a request that decodes as protobuf but breaks the contract."""


def short(value: str, limit: int = ID_CHARS) -> str:
    """``repr(value)``, cut to `limit` characters (saying how long it was)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def clip(detail: str) -> str:
    """A status detail of at most `DETAIL_CHARS` characters."""
    if len(detail) <= DETAIL_CHARS:
        return detail
    return detail[: DETAIL_CHARS - 20] + f"... ({len(detail)} characters)"


class RejectLog:
    """Logs refused requests: one WARNING per `interval` with the count left out, details at DEBUG."""

    def __init__(self, interval: float = WARN_INTERVAL) -> None:
        self._interval = interval
        self._lock = threading.Lock()  # hook threads report too (a hook's own malformed-input errors)
        self._next = 0.0
        self._left_out = 0
        self.total = 0
        """Requests refused since the server started."""

    def note(self, rpc: str, why: str, detail: object = None) -> None:
        """Record one refused `rpc` call; `why` must not contain request content (`detail` may)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("refused a %s request: %s (%s)", rpc, why, detail)
        now = time.monotonic()
        with self._lock:
            self.total += 1
            if now < self._next:
                self._left_out += 1
                return
            left_out, self._left_out = self._left_out, 0
            self._next = now + self._interval
        more = f"; {left_out} more refused since the last warning" if left_out else ""
        log.warning("refused a malformed %s request: %s%s", rpc, why, more)


def decode(message_class: Any, raw: bytes, rpc: str, rejects: RejectLog) -> Any:
    """`raw` parsed as `message_class`, or InvalidInputError (corrupt bytes, too deep, bad UTF-8)."""
    try:
        return message_class.FromString(raw)
    except (DecodeError, RecursionError) as exc:
        name = message_class.DESCRIPTOR.full_name
        rejects.note(rpc, f"not a valid {name} ({len(raw)} bytes)", exc)
        raise InvalidInputError(
            f"malformed {rpc} request: not a valid {name} (corrupt bytes, nesting deeper than "
            "protobuf's 100 levels, or a string that is not UTF-8)"
        ) from exc
