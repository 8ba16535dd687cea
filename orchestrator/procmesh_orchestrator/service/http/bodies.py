"""What every route of the HTTP room reads and answers with: JSON bodies under their limits,
query integers, the reference server's JSON and error shapes, and responses that give a run slot
back once they are sent (or their client left)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from procmesh_orchestrator.service._errors import (
    BadRequestError,
    ClientGoneError,
    RequestTimeoutError,
    TooLargeError,
    UnsupportedMediaTypeError,
)
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import MAX_PAGE, label

Release = Callable[[], Awaitable[None]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response (compact, UTF-8)."""
    return Response(dumps(body), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, message: str, **extra: Any) -> Response:
    """The error shape of the reference server: ``{"error": message}``."""
    headers = {"WWW-Authenticate": 'Bearer realm="procmesh"'} if status == 401 else None
    return json_response({"error": message, **extra}, status, headers)


class _Releasing(Response):
    """A response that runs its `release` once it is sent, or once its client went away."""

    _release: Release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


class GatedResponse(_Releasing):
    """A JSON response that gives its call's run slot back once it is sent."""

    def __init__(self, body: Any, release: Release) -> None:
        super().__init__(dumps(body), media_type="application/json")
        self._release = release


class EventStreamResponse(_Releasing, StreamingResponse):
    """Server-sent events of one run; `release` runs once it is sent or the client left."""

    def __init__(
        self, events: AsyncIterator[bytes], release: Release, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._release = release


class DuplicateKeyError(ValueError):
    """A JSON object holding a key twice (`decode_json`)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(f"the key {label(key)} is given twice in one object")
            seen.add(key)
    return out


def decode_json(text: str | bytes | bytearray) -> Any:
    """`text` as JSON, refusing an object that holds a key twice (`DuplicateKeyError`): `json`
    keeps the last without a word, so ``{"threadId": "a", ..., "threadId": "b"}`` would run on b,
    its a dropped. A ValueError (RecursionError: too deep) otherwise, as `json.loads`."""
    return json.loads(text, object_pairs_hook=_object)


async def _read_json(request: Request, limit: int, timeout: float) -> Any:
    """The body as JSON, refusing more than `limit` bytes before or while reading it, or a body
    that takes longer than `timeout` seconds to arrive."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaTypeError(
            f"send the body as Content-Type: application/json (got {media_type[:64] or 'none'!r})"
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLargeError(f"request body of {int(length)} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise TooLargeError(f"request body exceeds the limit of {limit} bytes")
    except TimeoutError:
        raise RequestTimeoutError(f"the request body did not arrive within {timeout:g}s") from None
    except ClientDisconnect:
        raise ClientGoneError("the client closed the connection while sending the body") from None
    if not body:
        raise BadRequestError("empty body: send a JSON object with a 'messages' field")
    try:
        return decode_json(body)
    except RecursionError:
        raise BadRequestError("malformed JSON body: nests too deep") from None
    except ValueError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from None


async def read_body(core: ServiceCore, request: Request) -> Any:
    """The request's JSON body under the service's size and time limits."""
    return await _read_json(request, core.settings.max_request_bytes, core.settings.body_timeout_seconds)


def refuse_unknown(body: dict[str, Any], allowed: Collection[str], hint: str = "") -> None:
    """A 400 naming the body's keys outside `allowed` (and `hint`, why): nothing is ignored."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        names = ", ".join(label(k) for k in unknown)
        raise BadRequestError(f"unknown keys: {names}{f' ({hint})' if hint else ''}")


Endpoint = Callable[[Request], Awaitable[Response]]


def takes_query(endpoint: Endpoint, *names: str) -> Endpoint:
    """`endpoint`, refusing a query parameter outside `names` with a 400 naming it (a parameter
    no route reads would otherwise change nothing, silently), and one given more than once (a
    route reads one value: the others would be dropped, silently); checking ``requestContext``
    (when taken) is client-js's base64 JSON object wherever the route reads it or not."""
    allowed = frozenset(names)

    async def checked(request: Request) -> Response:
        query = request.query_params
        if unknown := sorted(set(query) - allowed):
            taken = f"this route takes {', '.join(sorted(allowed))}" if allowed else "this route takes none"
            raise BadRequestError(
                f"unknown query parameters: {', '.join(label(k) for k in unknown)} ({taken})"
            )
        if len(query.multi_items()) > len(query):
            twice = sorted({k for k in query if len(query.getlist(k)) > 1})
            raise BadRequestError(
                f"query parameters given more than once: {', '.join(label(k) for k in twice)} "
                "(give each once: the route reads one value)"
            )
        if "requestContext" in allowed:
            query_context(request)
        return await endpoint(request)

    return checked


def route(path: str, endpoint: Endpoint, method: str, *query: str) -> Route:
    """A route of the API taking the `query` parameters named and no other (`takes_query`)."""
    return Route(path, takes_query(endpoint, *query), methods=[method])


def query_context(request: Request) -> dict[str, Any]:
    """The ``requestContext`` query parameter as client-js sends it: base64 of its JSON object."""
    raw = request.query_params.get("requestContext")
    if not raw:
        return {}
    try:
        context = decode_json(base64.b64decode(raw, validate=True))
    except DuplicateKeyError as exc:
        raise BadRequestError(f"requestContext: {exc}") from None
    except (ValueError, binascii.Error):
        raise BadRequestError("requestContext: must be base64 of a JSON object") from None
    if not isinstance(context, dict):
        raise BadRequestError("requestContext: must be base64 of a JSON object")
    return context


def query_int(raw: str | None, name: str, default: int, low: int) -> int:
    if raw is None or raw == "":
        return default
    # isascii: str.isdigit takes '²' too, which int() refuses (a 500, not this 400)
    if not (raw.isascii() and raw.isdigit()) or int(raw) < low or int(raw) > MAX_PAGE:
        raise BadRequestError(f"{name}: must be an integer from {low} to {MAX_PAGE}")
    return int(raw)


async def no_release() -> None:
    """Observing holds no run slot: the run goes on whether or not anyone watches."""


def releaser(core: ServiceCore) -> Release:
    """Give a call's run slot back exactly once."""
    released = False

    async def release() -> None:
        nonlocal released
        if not released:
            released = True
            core.gate.leave()

    return release
