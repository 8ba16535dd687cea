"""Input verdicts kept per run: a guard's ``processInput`` called again in a run asks nothing again.

The orchestrator sends the speculative guards of a lane at once, each on the messages as they
are, and calls one again when a guard before it changed its input: language detection adds
metadata to every message, so the PII guard after it is called again on the same texts. That
call asked the gateway about every message once more (bench P8: 19 questions, all answered by
the verdict cache, 15-125 ms between the input guards' verdicts and the first streamed chunk).
Kept, the verdicts of the run's earlier call answer it at once.

A verdict is kept per run, the guard's options and the text (its digest), in a bounded map, and
only once decided: a failed call keeps nothing (the call made again asks again). It is the one
the run was given for that text: the verdict cache would give the same, and without a cache the
judge is asked once per text, as when the lane's guards run one after another.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class KeptVerdicts(Generic[V]):
    """Verdicts by (run, options, text), the `limit` most recent."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: OrderedDict[tuple[str, str, bytes], V] = OrderedDict()

    async def get(self, run_id: str, options: Any, text: str, decide: Callable[[], Awaitable[V]]) -> V:
        """The verdict the run was given for `text` under `options`, else `decide`'s (then kept).
        Without a run id nothing is kept."""
        if not run_id:
            return await decide()
        key = (run_id, options.model_dump_json(), hashlib.sha256(text.encode()).digest())
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        verdict = await decide()
        self._kept[key] = verdict
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)
        return verdict
