"""HookLoop: a thread with its own asyncio loop, where one processor's code runs.

A hook that burns CPU without awaiting would otherwise stall the grpc.aio server's loop: health
checks time out (the pod is restarted or taken out of service), other processors' calls and new
calls wait, and a call whose deadline passed keeps the loop busy. So each hosted processor gets a
HookLoop and all of its code (``setup()``, every hook, ``teardown()``) runs there; the server loop
only decodes, dispatches and awaits. The GIL still lets the server thread run between a CPU-bound
hook's bytecodes (every ``sys.getswitchinterval()``, 5 ms), so health answers in milliseconds.

One loop per processor rather than one for the whole sidecar: a CPU-bound hook of one processor
then cannot delay the hooks of the others hosted beside it, and a processor's loop-bound clients
(``redis.asyncio``, ``httpx.AsyncClient``) are still created and used on one loop, as they require.
When the calling RPC is cancelled or its deadline passes, the hook's task is cancelled: it stops at
its next ``await`` (pure computation cannot be interrupted; it ends when it returns).

The price is two thread wake-ups per call (one per batch on the output stream), measured at
0.2-0.4 ms on a busy 2-core machine. A deployment that trusts its hooks to be quick can run them
inline on the server loop instead (``threaded=False``; ``PROCMESH_HOOK_THREADS=false``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class HookLoop:
    """An asyncio loop on its own daemon thread; `run()` awaits a coroutine there from another loop."""

    def __init__(self, name: str, *, threaded: bool = True) -> None:
        self._name = name
        self._threaded = threaded
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread and its loop (returns once the loop accepts work)."""
        if not self._threaded:
            return
        ready = threading.Event()
        # daemon: a hook stuck in computation must not keep the process alive after stop()
        self._thread = threading.Thread(target=self._main, args=(ready,), name=self._name, daemon=True)
        self._thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()  # hooks still running at stop: let their finally blocks run
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` on this loop; cancelling the caller cancels it there too.

        `fn` is called on the hook loop, so even the synchronous part of a hook (before its first
        ``await``) runs there. Not threaded: awaited on the caller's loop.
        """
        if not self._threaded:
            return await fn()
        result: T = await relay([(self, fn)])
        return result

    def _target(self, caller: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        if not self._threaded:
            return caller
        if self._loop is None:
            raise RuntimeError(f"{self._name} is not running (ProcessorServer.start() starts it)")
        return self._loop

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is left, stop the loop and wait up to `timeout` s for the thread to end."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, timeout)


async def relay(steps: Sequence[tuple[HookLoop, Callable[[], Awaitable[Any]]]]) -> Any:
    """Await each step's ``fn()`` on its loop in turn; the last one's result.

    Each loop hands on to the next directly, so n steps cost n + 1 thread wake-ups, not 2n (a
    fused stream's processors, each on its own loop); one step costs one wake-up each way and
    nothing else (run_coroutine_threadsafe + wrap_future add a concurrent Future, with its lock,
    and two chained callbacks). Cancelling the caller cancels the step running, at its next await.
    """
    caller = asyncio.get_running_loop()
    done: asyncio.Future[Any] = caller.create_future()
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

    def settle(task: asyncio.Task[Any]) -> None:  # on the caller's loop
        if done.done():
            return
        if task.cancelled():
            done.cancel()
        elif (exc := task.exception()) is not None:
            done.set_exception(exc)
        else:
            done.set_result(task.result())

    def begin(at: int, loop: asyncio.AbstractEventLoop) -> None:  # on step `at`'s loop
        if done.cancelled():
            return
        task = loop.create_task(_awaited(steps[at][1]))
        running[:] = [(loop, task)]
        task.add_done_callback(lambda t: after(at, t))

    def after(at: int, task: asyncio.Task[Any]) -> None:  # on step `at`'s loop, when it is done
        if at + 1 < len(steps) and not task.cancelled() and task.exception() is None:
            hand(at + 1)
        else:
            caller.call_soon_threadsafe(settle, task)

    def hand(at: int) -> None:
        loop = steps[at][0]._target(caller)
        loop.call_soon_threadsafe(begin, at, loop)

    hand(0)
    try:
        return await done
    except asyncio.CancelledError:
        if running:  # the caller was cancelled (or its deadline passed): so is the step running
            loop, task = running[0]
            loop.call_soon_threadsafe(task.cancel)
        raise


async def _awaited(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()
