"""Server-sent events: the heartbeat every stream of the HTTP API sends (runs and durable runs).

A proxy in front of the API cuts a connection idle for its timeout (often 60 s); a tool or a
model can be silent longer. A comment line (``: ping``) after every ``sse_heartbeat_seconds``
without an event keeps it open; SSE clients, @mastra/client-js included, skip comments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from procmesh_orchestrator.errors import EventLogError, OrchestratorError
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.call_options import validated
from procmesh_orchestrator.service.api.durable import LOG_CUT, check_run_id
from procmesh_orchestrator.service.api.results import (
    Chunk,
    Framing,
    StreamWarnings,
    dumps,
    wire_chunk,
)
from procmesh_orchestrator.store import MAX_ID_CHARS

log = logging.getLogger(__name__)

HEARTBEAT = b": ping\n\n"

T = TypeVar("T")


async def with_heartbeats(items: AsyncIterator[T], every: float) -> AsyncIterator[T | None]:
    """The items in order, with None after every `every` seconds without one (0: never).

    The pending read is waited on, never cancelled, so no item is lost or reordered; it is
    cancelled only when the consumer goes away. An error of `items` is raised where it happened.
    """
    if every <= 0:
        async for item in items:
            yield item
        return
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending


class _ObserveBody(BaseModel):
    """observe's body, as @mastra/client-js ``observe({runId, offset?})`` sends it: any other key
    is refused by name (a reattach that silently took another meaning would replay the wrong
    events)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    offset: int | None = Field(default=None, ge=0, strict=True)


def parse_observe(data: Any, last_event_id: str | None) -> tuple[str, int]:
    """The run and the first offset an observe request wants: ``offset``, else the event after
    ``Last-Event-ID``, else 0."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with 'runId'")
    body = validated(_ObserveBody, data)
    check_run_id(body.run_id)
    if body.offset is not None:
        return body.run_id, body.offset
    if last_event_id is not None and last_event_id.strip():
        raw = last_event_id.strip()
        if not raw.isdigit() or len(raw) > 18:
            raise BadRequestError("Last-Event-ID: must be the id of an event this server sent (an offset)")
        return body.run_id, int(raw) + 1
    return body.run_id, 0


async def durable_events(
    run_id: str,
    events: AsyncIterator[tuple[int, Chunk]],
    what: str,
    heartbeat: float,
    warnings: StreamWarnings,
) -> AsyncIterator[bytes]:
    """Server-sent events of a durable run: per event an ``id: <offset>`` event, then its
    ``data: <chunk>`` event, then ``data: [DONE]``, with a ``: ping`` comment line after every
    `heartbeat` seconds without one (as any stream of the API: `with_heartbeats`). A log that
    fails mid-way ends the stream with an ``error`` chunk and no ``[DONE]``: the run goes on, the
    client reattaches (``Last-Event-ID``).

    The id goes in an event of its own, written with its chunk: @mastra/client-js reads only
    events that are one ``data:`` line (an id line in them hides the chunk), while an
    ``EventSource`` takes the id of an event without data as the last event id, which the chunk's
    event then carries (and a reconnect sends as ``Last-Event-ID``). Its ``step-finish`` and
    ``finish`` chunks carry `warnings` as a plain stream's do (`StreamWarnings`: the starting
    call's own, none for an observer, and the model calls' from the log's ``step-start`` chunks;
    an observer from a later offset has only those it read)."""
    started = asyncio.get_running_loop().time()
    sent = 0
    framing = Framing()
    try:
        async for event in with_heartbeats(events, heartbeat):
            if event is None:
                yield HEARTBEAT
                continue
            offset, chunk = event
            sent += 1
            warnings.see(chunk)
            *framing_chunks, chunk = framing.frame(chunk)  # before the id: they are no event of the log
            for framed in framing_chunks:
                yield f"data: {dumps(wire_chunk(framed, run_id))}\n\n".encode()
            yield f"id: {offset}\n\ndata: {dumps(wire_chunk(chunk, run_id, warnings))}\n\n".encode()
    except (EventLogError, OrchestratorError) as exc:
        log.warning("%s run=%s: event log failed after %d events: %s", what, run_id, sent, exc)
        error = {"type": "error", "payload": {"message": LOG_CUT}}
        yield f"data: {dumps(wire_chunk(error, run_id))}\n\n".encode()
        return
    log.info(
        "%s durable run=%s events=%d %.3fs", what, run_id, sent, asyncio.get_running_loop().time() - started
    )
    for chunk in framing.close():
        yield f"data: {dumps(wire_chunk(chunk, run_id))}\n\n".encode()
    yield b"data: [DONE]\n\n"
