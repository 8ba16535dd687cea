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

It also remembers which texts the guard asked about before under the same options, in any run
(`asked_before`, bounded too): only to choose which questions leave first. A conversation re-sends
its history every turn; the gateway's verdict cache answers what was asked before, so the
questions the judge must answer (the new message, and the last answer, which the input guards
see for the first time) go ahead of the ones it will answer at once. Nothing is answered from
that memory: every verdict still comes from the gateway (and its cache, with its tenancy).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class KeptVerdicts(Generic[V]):
    """Verdicts by (run, options, text), and the texts asked about by (options, text): the
    `limit` most recent of each. `options` is the guard's options as their JSON text (one
    ``model_dump_json`` per call, not per message)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: OrderedDict[tuple[str, str, bytes], V] = OrderedDict()
        self._asked: OrderedDict[tuple[str, bytes], None] = OrderedDict()

    def asked_before(self, options: str, text: str) -> bool:
        """Whether a question about `text` under `options` was answered before, in any run."""
        return (options, _digest(text)) in self._asked

    async def get(self, run_id: str, options: str, text: str, decide: Callable[[], Awaitable[V]]) -> V:
        """The verdict the run was given for `text` under `options`, else `decide`'s (then kept).
        Without a run id no verdict is kept (the question is still remembered as asked)."""
        digest = _digest(text)
        key = (run_id, options, digest)
        kept = self._kept.get(key) if run_id else None
        if kept is not None:
            return kept
        verdict = await decide()
        _bounded(self._asked, (options, digest), None, self._limit)
        if run_id:
            _bounded(self._kept, key, verdict, self._limit)
        return verdict


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _bounded(kept: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """`key` set to `value` as the newest entry; the oldest dropped past `limit`."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > limit:
        kept.popitem(last=False)
