"""HookLoop: a thread with its own asyncio loop, where one processor's code runs.

A hook that burns CPU without awaiting would otherwise stall the grpc.aio server's loop: health
checks time out (the pod is restarted or taken out of service), other processors' calls and new
calls wait, and a call whose deadline passed keeps the loop busy. So each hosted processor gets a
HookLoop and all of its code (``setup()``, every hook, ``teardown()``) runs on its loop; the server
loop only decodes, dispatches and awaits. The GIL still lets the server thread run between a
CPU-bound hook's bytecodes (every ``sys.getswitchinterval()``, 5 ms), so health answers in
milliseconds.

One loop per processor rather than one for the whole sidecar: a CPU-bound hook of one processor
then cannot delay the hooks of the others hosted beside it, and a processor's loop-bound clients
(``redis.asyncio``, ``httpx.AsyncClient``) are still created and used on one loop, as they require.
When the calling RPC is cancelled or its deadline passes, the hook's task is cancelled: it stops at
its next ``await`` (pure computation cannot be interrupted; it ends when it returns).

Handing a call to the loop's thread costs two thread wake-ups (0.2-0.4 ms on a busy 2-core
machine), most of a quick hook's cost. So when the thread is idle (blocked in its selector) and
the processor has shown its loop's turns to be quick, the server thread takes the turn itself
(`_Turns`): it runs the hook loop's ready callbacks, with the hook loop as the running loop, until
the hook's task is done — no wake-up either way. The hook still runs on its own loop (its futures,
timers and clients are that loop's), only on another thread. A turn that holds the CPU longer than
the switch interval makes the processor's calls go through the thread again until it has shown
quick turns for twice as long as before (a hook that turns CPU-bound after many quick calls stalls
the server once, for that one turn); a hook still running after that budget of CPU continues on its
thread. A processor may decide instead (``Processor.quick_hooks``): True takes its turns from the
first call, False never. A deployment that trusts its hooks to be quick can run them on the server
loop outright (``threaded=False``; ``PROCMESH_HOOK_THREADS=false``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import selectors
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_UNTRIED: Any = object()
"""`relay`'s first step had no turn tried yet."""
_FIRST_PROOF = 16
"""Quick turns of its loop a processor shows before the server thread takes turns for it."""
_MAX_PROOF = 1 << 20


class _Turns(selectors.DefaultSelector):
    """The hook loop's selector, and who may run the loop: its thread holds `lock` except while it
    waits in ``select``, so the server thread can take a turn exactly when the loop is idle.

    It also keeps the record of how long turns hold the CPU: `proven` once `streak` quick ones
    in a row reached `need`; a slow one resets the streak and doubles what it must reach.
    """

    def __init__(self, quick: bool | None) -> None:
        super().__init__()
        self.quick = quick
        """The processor's declaration (`Processor.quick_hooks`): None lets the record decide."""
        self.lock = threading.Lock()
        self.owner = 0
        """The hook thread's id (``select`` from any other thread is a taken turn's: no hand-over)."""
        self.budget = sys.getswitchinterval()
        """CPU seconds a quick turn stays under: what a hook on its thread makes the server wait anyway."""
        self.since = 0.0
        self.streak = 0
        self.need = _FIRST_PROOF

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if threading.get_ident() != self.owner:
            return super().select(timeout)
        self.record(time.thread_time() - self.since)
        self.lock.release()
        try:
            return super().select(timeout)
        finally:
            self.lock.acquire()
            self.since = time.thread_time()

    def record(self, cpu: float) -> None:
        if cpu <= self.budget:
            self.streak += 1
        else:
            self.streak = 0
            self.need = min(self.need * 2, _MAX_PROOF)

    @property
    def proven(self) -> bool:
        return self.streak >= self.need if self.quick is None else self.quick


class HookLoop:
    """An asyncio loop on its own daemon thread; `run()` awaits a coroutine there from another loop."""

    def __init__(self, name: str, *, threaded: bool = True, quick: bool | None = None) -> None:
        self._name = name
        self._threaded = threaded
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._turns = _Turns(quick)

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
        turns = self._turns
        turns.lock.acquire()
        turns.owner = threading.get_ident()
        turns.since = time.thread_time()
        loop = asyncio.SelectorEventLoop(turns)
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
            turns.lock.release()

    def run(self, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """``fn()`` on this loop, to be awaited at once; cancelling the caller cancels it there too.

        `fn` is called on the hook loop, so even the synchronous part of a hook (before its first
        ``await``) runs there. Not threaded: awaited on the caller's loop. Not a coroutine itself:
        most calls are done in the turn taken here, and awaiting their finished task gives the
        result (or raises) without another frame or `relay`'s set-up.
        """
        if not self._threaded:
            return fn()
        taken = self._take_turn(fn, asyncio.get_running_loop(), time.thread_time())
        if taken is not None and taken.done():
            return taken  # type: ignore[no-any-return]
        return relay([(self, fn)], taken)

    def _target(self, caller: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        if not self._threaded:
            return caller
        if self._loop is None:
            raise RuntimeError(f"{self._name} is not running (ProcessorServer.start() starts it)")
        return self._loop

    def _take_turn(
        self, fn: Callable[[], Awaitable[Any]], caller: asyncio.AbstractEventLoop, began: float
    ) -> Any:
        """Start ``fn()`` as a task of this loop and run the loop from the calling thread while
        its thread is idle, until the task is done or has had its CPU budget; the task, or None
        when the loop is not idle (or not proven quick): then the thread must be woken. `began`:
        the calling thread's CPU clock (``time.thread_time``) read before.

        No other thread runs the loop meanwhile: its thread waits for `lock` to leave ``select``.
        """
        turns, loop = self._turns, self._loop
        # asyncio's debug mode refuses a loop's non-thread-safe calls from another thread
        if loop is None or not turns.proven or loop.get_debug() or not turns.lock.acquire(blocking=False):
            return None
        scheduled: list[Any] = loop._scheduled  # type: ignore[attr-defined]
        first = scheduled[0] if scheduled else None
        asyncio._set_running_loop(loop)
        try:
            # `fn` called here, with this loop running, as `_awaited` would call it on the loop's
            # thread; a coroutine becomes the task itself (no wrapper frame, nor create_task's).
            made = fn()
            task = asyncio.Task(made if asyncio.iscoroutine(made) else _awaited(lambda: made), loop=loop)
            # A step's CPU is bounded by its wall time (perf_counter: no syscall); only a step
            # longer than the budget reads the thread's CPU clock (a syscall, several µs on a busy
            # VM: read around every step, it was a third of a fused part's time in the SDK). The
            # thread's CPU since `began` bounds the step's too, so a step the OS preempted is not
            # taken for a slow one.
            # The loop's ready callbacks are run here one by one, not through ``_run_once``: that
            # would poll the selector (a syscall) and scan the timers at every step, and the
            # loop is idle (its thread waits for `lock`), so only what the task schedules is ready.
            # A timer that comes due meanwhile is the thread's to run once it has the loop back.
            ready: collections.deque[asyncio.Handle] = loop._ready  # type: ignore[attr-defined]
            spent = 0.0
            while not task.done() and ready and spent <= turns.budget:
                handle = ready.popleft()
                if handle._cancelled:
                    continue
                t0 = time.perf_counter()
                handle._run()
                cpu = time.perf_counter() - t0
                if cpu > turns.budget:
                    cpu = min(cpu, time.thread_time() - began)
                turns.record(cpu)
                spent += cpu
        finally:
            asyncio._set_running_loop(caller)
            turns.lock.release()
        # The thread computed its select timeout before this turn: wake it for what is left to do.
        if not task.done() or loop._ready or (scheduled and scheduled[0] is not first):  # type: ignore[attr-defined]
            loop._write_to_self()  # type: ignore[attr-defined]
        return task

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is left, stop the loop and wait up to `timeout` s for the thread to end."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, timeout)


async def relay(steps: Sequence[tuple[HookLoop, Callable[[], Awaitable[Any]]]], taken: Any = _UNTRIED) -> Any:
    """Await each step's ``fn()`` on its loop in turn; the last one's result. `taken`: what
    the first step's `HookLoop._take_turn` already gave (a task still running, or None).

    A step whose loop is idle runs in a turn the caller's thread takes (`HookLoop._take_turn`):
    no wake-up. Otherwise each loop hands on to the next directly, so n steps cost n + 1 thread
    wake-ups, not 2n (a fused stream's processors, each on its own loop); one step costs one
    wake-up each way and nothing else (run_coroutine_threadsafe + wrap_future add a concurrent
    Future, with its lock, and two chained callbacks). Cancelling the caller cancels the step
    running, at its next await.
    """
    caller = asyncio.get_running_loop()
    at = 0
    began = time.thread_time()  # once for all the turns taken here (`HookLoop._take_turn`)
    while at < len(steps):
        if taken is _UNTRIED or at > 0:
            taken = steps[at][0]._take_turn(steps[at][1], caller, began)
        if taken is None or not taken.done():
            break
        if at + 1 == len(steps) or taken.cancelled() or taken.exception() is not None:
            return taken.result()
        at += 1
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

    def watch(at: int, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:  # on `loop`
        running[:] = [(loop, task)]
        task.add_done_callback(lambda t: after(at, t))

    def begin(at: int, loop: asyncio.AbstractEventLoop) -> None:  # on step `at`'s loop
        if not done.cancelled():
            watch(at, loop, loop.create_task(_awaited(steps[at][1])))

    def after(at: int, task: asyncio.Task[Any]) -> None:  # on step `at`'s loop, when it is done
        if at + 1 < len(steps) and not task.cancelled() and task.exception() is None:
            hand(at + 1)
        else:
            caller.call_soon_threadsafe(settle, task)

    def hand(at: int) -> None:
        loop = steps[at][0]._target(caller)
        loop.call_soon_threadsafe(begin, at, loop)

    if taken is None:
        hand(at)
    else:  # a taken turn's task still running: it goes on on its loop's thread
        loop = steps[at][0]._target(caller)
        running[:] = [(loop, taken)]
        loop.call_soon_threadsafe(watch, at, loop, taken)
    try:
        return await done
    except asyncio.CancelledError:
        if running:  # the caller was cancelled (or its deadline passed): so is the step running
            loop, task = running[0]
            loop.call_soon_threadsafe(task.cancel)
        raise


async def _awaited(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()
