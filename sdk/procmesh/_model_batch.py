"""Model gateway calls a hook makes at once, sent as one ``GenerateBatch`` call.

An input guard judges every message of a conversation concurrently: ten turns in, that is 19
questions a guard, most of which the gateway's verdict cache answers. Sent one call each, the
gRPC work per call (both ends' encoding, the server's handler and interceptor, the client's
completion) cost more than the cache lookups: 76 calls of four guards took 30-40 ms of the
orchestrator's CPU, while the answer's first window waited behind them for the judge.

So calls are gathered per event loop for one turn of it: the first call of a turn schedules a
flush (``call_soon``), and every call made before the loop gets to it (the rest of a
``gather``'s tasks) goes in the same request. One call alone goes as ``Generate``, as ever. Calls
go together only with the same gateway and the same metadata (the API key and the calling hook's
trace context); each keeps its own deadline (``timeout_seconds``), the batch call's is the
longest of theirs. Answers come back as they are ready (a cached verdict at once) and each
caller gets its own answer or status, exactly what ``Generate`` would have returned it.

A gateway without ``GenerateBatch`` (an orchestrator older than this SDK, met during a rolling
upgrade) answers UNIMPLEMENTED: its calls are sent again one by one, and that gateway is sent
single calls from then on (logged once).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine, Hashable
from dataclasses import dataclass
from typing import Any

import grpc

from procmesh.v1 import model_pb2 as mpb

log = logging.getLogger(__name__)

MAX_BATCH = 1024
"""The gateway's limit on one batch's calls; more waiting go in further batches."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class GatewayStatus(Exception):
    """A call's failure as the gateway gave it: its gRPC status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass
class _Call:
    request: mpb.ModelServiceGenerateRequest
    timeout: float
    answer: asyncio.Future[mpb.ModelServiceGenerateResponse]


class Batches:
    """One event loop's calls waiting to be sent, by gateway and metadata."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[Hashable, tuple[tuple[str, Any], ...]], list[_Call]] = {}
        """The calls waiting for the loop's next turn, by gateway and metadata."""
        self._single: set[Hashable] = set()  # gateways without GenerateBatch
        self._sending: set[asyncio.Future[None]] = set()

    async def generate(
        self,
        stub: Any,
        gateway: Hashable,
        request: mpb.ModelServiceGenerateRequest,
        timeout: float,
        metadata: tuple[tuple[str, Any], ...],
    ) -> mpb.ModelServiceGenerateResponse:
        """`request`'s answer through `stub` (`gateway` names its channel); GatewayStatus on failure."""
        loop = asyncio.get_running_loop()
        call = _Call(request, timeout, loop.create_future())
        key = (gateway, metadata)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = []
            loop.call_soon(self._flush, stub, gateway, metadata)
        waiting.append(call)
        return await call.answer

    def _flush(self, stub: Any, gateway: Hashable, metadata: tuple[tuple[str, Any], ...]) -> None:
        waiting = self._waiting.pop((gateway, metadata))
        calls = [c for c in waiting if not c.answer.done()]  # a caller cancelled meanwhile
        for start in range(0, len(calls), MAX_BATCH):
            chunk = calls[start : start + MAX_BATCH]
            if len(chunk) == 1 or gateway in self._single:
                for one in chunk:
                    self._start(_alone(stub, one, metadata))
            else:
                self._start(self._together(stub, gateway, chunk, metadata))

    async def _together(
        self, stub: Any, gateway: Hashable, calls: list[_Call], metadata: tuple[tuple[str, Any], ...]
    ) -> None:
        items = [
            mpb.ModelServiceGenerateBatchItem(request=c.request, timeout_seconds=c.timeout) for c in calls
        ]
        stream = stub.GenerateBatch(
            mpb.ModelServiceGenerateBatchRequest(items=items),
            timeout=max(c.timeout for c in calls),
            metadata=metadata,
        )

        def gone(_: asyncio.Future[Any]) -> None:
            # every caller answered or gone, one gone (its hook cancelled): none waits for the rest
            answers = [c.answer for c in calls]
            if all(a.done() for a in answers) and any(a.cancelled() for a in answers):
                stream.cancel()

        for c in calls:
            c.answer.add_done_callback(gone)
        try:
            async for answer in stream:
                if not 0 <= answer.index < len(calls):
                    raise GatewayStatus(
                        grpc.StatusCode.INTERNAL,
                        f"the gateway answered an item it was not sent: {answer.index}",
                    )
                target = calls[answer.index].answer
                if target.done():
                    continue
                if answer.code:
                    code = _CODES.get(answer.code, grpc.StatusCode.UNKNOWN)
                    target.set_exception(GatewayStatus(code, answer.message or code.name))
                else:
                    target.set_result(answer.response)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                if gateway not in self._single:
                    log.info("model gateway: no GenerateBatch (an older orchestrator): calls go one by one")
                    self._single.add(gateway)
                await asyncio.gather(*(_alone(stub, c, metadata) for c in calls if not c.answer.done()))
                return
            _fail(calls, _status(exc))
            return
        except asyncio.CancelledError:
            _fail(calls, GatewayStatus(grpc.StatusCode.CANCELLED, "the batch call was cancelled"))
            raise
        except GatewayStatus as exc:
            stream.cancel()
            _fail(calls, exc)
            return
        _fail(
            calls,
            GatewayStatus(
                grpc.StatusCode.INTERNAL, "the gateway ended the batch without answering this call"
            ),
        )

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._sending.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._sending.discard)


def _status(exc: grpc.aio.AioRpcError) -> GatewayStatus:
    """A failed call's status: its details, or its code's name without any (`translate_rpc_error`'s)."""
    return GatewayStatus(exc.code(), exc.details() or exc.code().name)


def _fail(calls: list[_Call], error: GatewayStatus) -> None:
    for c in calls:
        if not c.answer.done():
            c.answer.set_exception(error)


async def _alone(stub: Any, call: _Call, metadata: tuple[tuple[str, Any], ...]) -> None:
    """`call` as a Generate call of its own."""
    try:
        response = await stub.Generate(call.request, timeout=call.timeout, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        if not call.answer.done():
            call.answer.set_exception(_status(exc))
        return
    except asyncio.CancelledError:
        if not call.answer.done():
            call.answer.cancel()
        raise
    if not call.answer.done():
        call.answer.set_result(response)


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batches] = weakref.WeakKeyDictionary()


def batches() -> Batches:
    """The running loop's batches (grpc.aio channels, and so calls, belong to one loop)."""
    loop = asyncio.get_running_loop()
    found = _batches.get(loop)
    if found is None:
        found = _batches[loop] = Batches()
    return found
