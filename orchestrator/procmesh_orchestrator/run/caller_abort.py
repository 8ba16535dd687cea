"""The caller's abort signal (`CallOptions.abort_signal`): stopping the loop where it is, and
finishing the run with what was done, as the reference does (SEED-GAPS C29).

The reference (@mastra/core 1.71) calls ``onAbort({steps, text})``, emits ``abort``, then runs the
output processors' processOutputResult over the response so far (its finishReason ``aborted``, the
interrupted step's text added as an assistant message), so the message-history processor stores
the user's input and that text. procmesh does the same, with the ``abort`` chunk last: a reader
of the stream knows it is over when it sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import steps
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.model_step import assistant_message

log = logging.getLogger(__name__)

T = TypeVar("T")


async def until_aborted(run: RunCore, work: Coroutine[Any, Any, T]) -> T | None:
    """Run `work` (the loop) until it ends or the caller's abort signal is set (then None).

    Aborting cancels the loop's task: the model call, processor calls (a sidecar sees its call
    cancelled) and tool calls in flight. The text streamed so far in the step is kept.
    """
    signal = run.options.abort_signal
    if signal is None:
        return await work
    if signal.is_set():
        work.close()
        _keep_partial_text(run)
        return None
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the caller itself was cancelled (a timeout): the loop goes too
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        _keep_partial_text(run)
        return None
    return task.result()


async def finalize(run: RunCore) -> tuple[TripwireAbort | None, BaseException | None]:
    """Finish an aborted run: `CallOptions.on_abort`, processOutputResult once (finishReason
    ``aborted``: memory keeps the turn so far), then the ``abort`` chunk. The abort that
    processOutputResult raised (memory after it saved nothing), and the failure that kept it from
    finishing (a store gone: the turn is unsaved, the run still aborted)."""
    if run.options.on_abort is not None:
        try:
            called = run.options.on_abort({"steps": list(run.steps), "text": run.partial_text})
            if inspect.isawaitable(called):
                await called
        except Exception:
            log.exception("run %s: the onAbort callback raised (ignored)", run.run_id)
    error: BaseException | None = None
    tripwire: TripwireAbort | None = None
    try:
        _, tripwire = await steps.output_result(run, run.text(), "aborted", clean=False)
    except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
        log.error("run %s: finalizing the aborted run failed: %s", run.run_id, exc)
        error = exc
    run.emit({"type": "abort", "payload": {}})
    return tripwire, error


def _keep_partial_text(run: RunCore) -> None:
    """The interrupted step's text, as streamed, becomes the response's last assistant message."""
    if run.partial_text:
        run.ml.add(assistant_message(run.partial_text, []), msgs.RESPONSE)
