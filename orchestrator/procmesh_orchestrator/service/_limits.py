"""Limits on what a caller may send and hold: input checked once at the API boundary, in linear time;
requests in flight per API key (`KeyLimits`).

Everything a caller sends ends up in protobuf messages to the sidecars, whose decoders refuse
nesting past 100 message levels (about 34 levels of JSON in a Struct) and strings that are not
valid UTF-8. Input that a sidecar's decoder would refuse must never get that far: a fail-open
guard would then be skipped and the model would see what the guard never checked. So the body is
walked here, iteratively (no recursion to overflow), and refused with a 400 / INVALID_ARGUMENT
that names the limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.service._auth import ANONYMOUS, Caller
from procmesh_orchestrator.service._errors import BadRequestError, TooManyRequestsError


@dataclass(frozen=True)
class InputLimits:
    """The limits (from `OrchestratorSettings`); each error message names its setting."""

    max_messages: int = 10_000
    """Messages in one request (``PROCMESH_MAX_INPUT_MESSAGES``)."""
    max_depth: int = 24
    """Nesting levels of the whole JSON body (``PROCMESH_MAX_INPUT_DEPTH``): the envelope takes about
    four (body, messages, message, content), leaving 20 for metadata, tool args and context."""
    max_string_chars: int = 1024 * 1024
    """Characters in one string (``PROCMESH_MAX_INPUT_STRING_CHARS``)."""


def _where(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path) or "body"


def check_input(value: Any, limits: InputLimits, *, root: tuple[str | int, ...] = ()) -> None:
    """Refuse `value` (decoded JSON) if it nests too deep or holds a string too long or not UTF-8.

    Linear in the size of `value`: one visit per node, paths built only for the error message.
    """
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, root)]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            _check_string(node, limits, path)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > limits.max_depth:
            raise BadRequestError(
                f"{_where(path)}: nests deeper than the limit of {limits.max_depth} levels "
                "(PROCMESH_MAX_INPUT_DEPTH)"
            )
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(key, str):
                    _check_string(key, limits, path)
                stack.append((item, depth + 1, (*path, str(key))))
        else:
            stack.extend((item, depth + 1, (*path, i)) for i, item in enumerate(node))


def check_message_count(count: int, limits: InputLimits) -> None:
    """Refuse a request with more messages than the limit."""
    if count > limits.max_messages:
        raise BadRequestError(
            f"messages: {count} messages exceed the limit of {limits.max_messages} per request "
            "(PROCMESH_MAX_INPUT_MESSAGES)"
        )


def _check_string(text: str, limits: InputLimits, path: tuple[str | int, ...]) -> None:
    if len(text) > limits.max_string_chars:
        raise BadRequestError(
            f"{_where(path)}: a string of {len(text)} characters exceeds the limit of "
            f"{limits.max_string_chars} (PROCMESH_MAX_INPUT_STRING_CHARS)"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # JSON's \ud800 escapes decode to lone surrogates, which UTF-8 (and protobuf) refuse.
            raise BadRequestError(f"{_where(path)}: not valid Unicode (a lone surrogate)") from None


class KeyLimits:
    """Requests and streams in flight per API key, both APIs together (``PROCMESH_MAX_INFLIGHT_PER_KEY``).

    The connection limit (``PROCMESH_MAX_CONNECTIONS``) is one for every caller: a single key that
    held that many streams open locked every tenant out (every request then got 503). Each key
    may hold `per_key` at once; the next one is refused with 429 / RESOURCE_EXHAUSTED naming the
    limit, while other keys are served. `ANONYMOUS` (no keys configured: development) is not
    limited here. Counts are per replica.
    """

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._inflight: dict[str, int] = {}

    def inflight(self, key_id: str) -> int:
        """What `key_id` has in flight now."""
        return self._inflight.get(key_id, 0)

    def take(self, caller: Caller) -> Callable[[], None]:
        """Take one of the caller's slots; returns what gives it back (once). TooManyRequestsError
        when the key has none free."""
        key = caller.key_id
        if key == ANONYMOUS.key_id:
            return _nothing
        held = self._inflight.get(key, 0)
        if held >= self.per_key:
            raise TooManyRequestsError(
                f"API key {key} has {held} requests in flight, its limit "
                f"(PROCMESH_MAX_INFLIGHT_PER_KEY={self.per_key}): retry when one has ended"
            )
        self._inflight[key] = held + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            left = self._inflight[key] - 1
            if left:
                self._inflight[key] = left
            else:
                del self._inflight[key]

        return give_back

    @contextlib.contextmanager
    def slot(self, caller: Caller) -> Iterator[None]:
        """Hold one of the caller's slots for the block (`take`)."""
        give_back = self.take(caller)
        try:
            yield
        finally:
            give_back()


def _nothing() -> None:
    """Nothing to give back."""
