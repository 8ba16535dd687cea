"""Giving the memory of finished streams back to the system (glibc's ``malloc_trim``).

A streamed run holds what it sent (its text, the model's chunks for the response cache) until it
ends. CPython frees that memory, but glibc keeps the freed pages in the process's heap whenever a
long-lived object sits above them, so the process stayed at its peak (2.3 GiB after ten clients
that never read had left). `MemoryTrim.soon`, called when a stream ends, runs ``malloc_trim(0)``
one second later, at most once per second, which returns every free page of the heap; when no run
is in flight any more it first collects cyclic garbage (a run's objects that only the cycle
collector frees would otherwise wait for the next allocations to trigger it). Elsewhere than on
glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import platform
from collections.abc import Callable

log = logging.getLogger(__name__)

DELAY_SECONDS = 1.0
"""After a stream ends, so a burst of ends costs one trim (a trim of a 1 GiB heap takes ~30 ms)."""


def _malloc_trim() -> Callable[[int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class MemoryTrim:
    """Debounced ``malloc_trim(0)`` on the running event loop."""

    def __init__(self, idle: Callable[[], bool], delay: float = DELAY_SECONDS) -> None:
        self._trim = _malloc_trim()
        self._idle = idle
        self._delay = delay
        self._handle: asyncio.TimerHandle | None = None

    @property
    def available(self) -> bool:
        """Whether this platform can give freed heap pages back (glibc)."""
        return self._trim is not None

    def soon(self) -> None:
        """Trim `delay` seconds from now, unless a trim is already due."""
        if self._trim is None or self._handle is not None:
            return
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._run)

    def _run(self) -> None:
        self._handle = None
        assert self._trim is not None
        if self._idle():
            gc.collect()
        self._trim(0)

    def cancel(self) -> None:
        """Drop a trim that is due (the service stops)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
