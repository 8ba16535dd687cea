"""The output stream's gRPC call: its errors translated, the sidecar's status kept, its time limits.

Raw gRPC errors of a stream are caught once, in `StreamCall`, and translated as a unary hook's
are (`procmesh.translate_rpc_error`, then `wire.call_error`); `SessionClock` cuts a session whose
part, end or whole outlasts its limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from procmesh import translate_rpc_error
from procmesh.errors import error_for_status
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.errors import ProcessorCallError
from procmesh_orchestrator.processors.wire import call_error

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller

_WRITE_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)
_CODES = {code.value[0]: code for code in grpc.StatusCode}
"""A status code's number (as gRPC's core gives it) to its `grpc.StatusCode`."""
_REPLACED = "Internal error from Core"
"""The details of the INTERNAL status grpc.aio puts in place of a call's own after a failed write."""


def _own_cancel() -> bool:
    """Whether the running task itself is being cancelled (not merely the call under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class StreamCall:
    """A ProcessOutputStream call whose gRPC errors come out translated: the stream's one boundary.

    A failed write is dropped here: the read that follows reports the stream's status,
    and the failure policy applies there, once. A call this side cancelled (a timeout, an abort,
    a fail-open cut) makes grpc raise `asyncio.CancelledError` in every write, half-close and
    read still waiting on it; that is not the task's own cancellation, so it comes out as a
    dropped write or a `ProcessorCallError` and the task that was waiting goes on (it used to
    end the task, and with it every part still to pass that stage: the run hung).
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._cut = False
        """This side cancelled the call (`cancel`)."""
        self._sent: tuple[grpc.StatusCode, str] | None = None
        """The status the call ended with, as it arrived (`_arrived`)."""
        self._write_failed = False
        raw.add_done_callback(self._arrived)

    def _arrived(self, call: Any) -> None:
        """Keep the call's status as it arrives. When a write fails because the sidecar has just
        ended the call, grpc.aio replaces the status the sidecar sent with its own INTERNAL
        "Internal error from Core" (grpc/grpc#36066; measured: 4 in 10 streams a sidecar ended
        while parts were being written). A refusal (INVALID_ARGUMENT) would then read as any
        failure, and a fail-open policy would let through what the guard refused. Only the call's
        core object holds the status at that moment; where it does not (another grpcio), nothing
        is kept and the status read is used."""
        if self._sent is not None:
            return  # the first is the sidecar's: a later one is the replacement
        status = getattr(getattr(call, "_cython_call", None), "_status", None)
        try:
            code, details = _CODES.get(status.code()), status.details()  # type: ignore[union-attr]
        except AttributeError:
            return
        if isinstance(code, grpc.StatusCode) and isinstance(details, str):
            self._sent = code, details

    def _error(self, exc: grpc.aio.AioRpcError) -> ProcessorCallError:
        """The failure policy's error for a failed call: the status the sidecar sent, where grpc
        replaced it with its own after a failed write (`_arrived`)."""
        sent = self._sent
        if exc.code() != grpc.StatusCode.INTERNAL:
            return call_error(translate_rpc_error(exc))
        if sent is not None and sent != (grpc.StatusCode.INTERNAL, _REPLACED):
            return call_error(error_for_status(sent[0], sent[1] or sent[0].name))
        if self._write_failed and exc.details() == _REPLACED:
            # Rarer: the write failed before the sidecar's status arrived, and gRPC kept its own.
            # The sidecar may have refused the input: fail-open must not let it through.
            return ProcessorCallError(
                "INTERNAL: the sidecar ended the stream while parts were being written and its "
                "status was lost (grpc/grpc#36066); it may have refused the input",
                input_refused=True,
            )
        return call_error(translate_rpc_error(exc))

    async def write(self, request: ppb.ProcessOutputStreamRequest | bytes) -> None:
        """Write a request (bytes already encoded on a call opened ``encoded``)."""
        try:
            await self._raw.write(request)
        except _WRITE_ERRORS:
            self._write_failed = True
            return
        except asyncio.CancelledError:
            if _own_cancel() or not self._cut:
                raise

    async def done_writing(self) -> None:
        try:
            await self._raw.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            return
        except asyncio.CancelledError:
            if _own_cancel() or not self._cut:
                raise

    async def read(self) -> ppb.ProcessOutputStreamResponse | None:
        """The next response; None at the stream's end."""
        try:
            resp = await self._raw.read()
        except asyncio.CancelledError:
            if _own_cancel() or not self._cut:
                raise
            raise ProcessorCallError("CANCELLED: the session was cut") from None
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        return None if resp is grpc.aio.EOF else resp

    def cancel(self) -> None:
        self._cut = True
        self._raw.cancel()

    def done(self) -> bool:
        return bool(self._raw.done())


GRPC_SLACK = 1.0
"""Seconds the gRPC deadline of a session allows past its ``streamTimeout``: the session's own
clock cuts it first, naming the limit; gRPC's deadline (also capped by the run's) is the backstop."""


class SessionClock:
    """The time limits of one stream session, checked by its reader.

    Each part's answer must come within the processor's `timeout` of when the part was queued
    (a write the sidecar does not take, because it stopped reading, counts against it too);
    once the orchestrator half-closed, the stream's end (which carries the states) must come
    within `timeout` of that; the whole session within `stream_timeout` (``streamTimeout``) of
    its opening. The run's deadline caps the first two.

    A timer checks them (`watch`) and cuts the call when one has passed, so the reader awaits
    the call's next response directly (`read`): no task and no timed wait per response, and one
    hand-off less between a response's arrival and the reader.
    """

    def __init__(self, caller: GrpcHookCaller, timeout: float, stream_timeout: float) -> None:
        self.info = caller.info
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.ends = time.monotonic() + stream_timeout
        self.closed_at: float | None = None
        """When the orchestrator half-closed (everything was sent): the end's clock starts."""
        self.expired: ProcessorCallError | None = None
        """The limit that passed (the call was cut for it)."""
        self._call: StreamCall | None = None
        self._oldest: Callable[[], float | None] = lambda: None
        self._timer: asyncio.TimerHandle | None = None

    def grpc_timeout(self, caller: GrpcHookCaller) -> float:
        """The session's gRPC deadline (the backstop)."""
        return caller.stream_timeout(self.stream_timeout + GRPC_SLACK)

    def watch(self, call: StreamCall, oldest: Callable[[], float | None]) -> None:
        """Check the limits of `call`'s session from now until `stop`; `oldest` gives when the
        oldest unanswered part was queued (None: none awaits)."""
        self._call, self._oldest = call, oldest
        self._check()

    def _check(self) -> None:
        assert self._call is not None
        try:
            wait = self.wait(self._oldest())
        except ProcessorCallError as exc:
            self.expired = exc
            self._call.cancel()  # its read ends at once, with this error (`read`)
            return
        self._timer = asyncio.get_running_loop().call_later(wait, self._check)

    async def read(self) -> ppb.ProcessOutputStreamResponse | None:
        """The watched call's next response (None at its end); the limit that passed, if the
        call was cut for one."""
        assert self._call is not None
        try:
            return await self._call.read()
        except ProcessorCallError:
            if self.expired is not None:
                raise self.expired from None
            raise

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def close(self) -> None:
        """Everything was sent (half-close queued): the stream's end is due from now."""
        if self.closed_at is None:
            self.closed_at = time.monotonic()

    def wait(self, oldest_sent: float | None) -> float:
        """Seconds the reader may wait for the next response, given when the oldest unanswered
        part was queued (None: none awaits); raises `ProcessorCallError` naming the limit
        once one has passed."""
        now = time.monotonic()
        if now >= self.ends:
            raise ProcessorCallError(f"stream session open longer than {self.stream_timeout:.3g}s")
        wait = min(self.timeout, self.ends - now)  # idle: wake up to start the clock of parts sent meanwhile
        since = oldest_sent if oldest_sent is not None else self.closed_at
        if since is None:
            return wait
        limit = self.timeout
        if self.info.deadline is not None:
            limit = min(limit, self.info.deadline - since)
        left = since + limit - now
        if left <= 0:
            if oldest_sent is not None:
                raise ProcessorCallError(f"timed out after {limit:.3g}s")
            raise ProcessorCallError(f"no stream end {limit:.3g}s after the last part")
        return min(wait, left)
