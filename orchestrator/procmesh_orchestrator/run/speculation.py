"""Walking a lane's unary hook: speculative calls and fused requests, committed in lane order.

A step function (`steps.py`) gives `walk` how to build a processor's arguments from the run as
it is now and how to apply an answer. Without speculative or fused processors that is the plain
loop: build, call, apply, next. Otherwise a *batch* goes out at once: the first processor (its
input is final) and the speculative ones after it, all with the same arguments, neighbours of
one sidecar in one fused request. Answers commit strictly in lane order: after committing one,
the next processor's arguments are built again from the run and compared with the ones its call
got. Equal: its answer stands. Different (the one before rewrote, dropped, signalled): it and
everything after it are discarded and the walk goes on from it with a new batch. An abort or a
fail-closed failure discards every later answer. A discarded answer leaves nothing behind: its
state, metrics, failure policy, violations, signals and chunks all apply at commit only, so the
run's trace is the sequential one. A processor that is not speculative is only ever the first
of a batch (or a fused neighbour of the first), so it sees final input only. A request-context
value a committed answer set changes the input of every call after it too.

Cheap first: a batch that starts with entries asking no judge model (a regex pack, a token
limit, a normalizer: deterministic and fast) ends before the first entry that asks one
(`Batchable.judged`), so a judge is sent only once the cheap checks in front of it answered
without ending the lane: when one of them aborts, no judge call is made at all, and each judge
that would have been sent with them is counted in ``procmesh_judge_calls_saved_total{by=
"cheap-first"}``. A judge already in a batch keeps the speculative entries after it, judges too,
running with it (no judge waits for another), and their calls are cancelled when one before them
aborts. What a run gives is the same: the order of commits is the lane's either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from procmesh_orchestrator.metrics import series
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Attempt, Batchable, Effects, HookArgs, Processor

A = TypeVar("A", bound=HookArgs[Any])

Build = Callable[[Processor], A]
"""A processor's arguments from the run's current state."""
Apply = Callable[[Processor, A, Any, Effects], Awaitable[bool]]
"""Apply a committed answer (the arguments it was given, its result, its effects); True ends the lane."""


async def walk(
    run: RunCore,
    items: Sequence[Processor],
    hook: str,
    build: Build[A],
    apply: Apply[A],
    *,
    step_number: int | None = None,
) -> None:
    """Call `hook` on every item of the lane that has it, in order, committing each answer."""
    lane = [item for item in items if item.has(hook)]
    fuse = run.info.fuse
    if not any(isinstance(i, Batchable) and (i.speculative or (fuse and i.fuse_key)) for i in lane):
        for item in lane:  # nothing to batch: the plain sequential loop
            args = build(item)
            with _at_step(run, step_number):
                answer = await run.call(item, args)
            if answer is not None and await apply(item, args, *answer):
                return
        return
    pos = 0
    while pos < len(lane):
        pos = await _batch(run, lane, pos, build, apply, step_number)


def plan(
    lane: Sequence[Processor], pos: int, *, fuse: bool, cheap_first: bool = True
) -> list[list[Processor]]:
    """The batch that starts at `pos`: requests (lists of fused processors) sent at once.

    The first request's first processor has final input; every other processor in the batch
    must be speculative (except the first's fused neighbours: the sidecar runs them only on
    what the one before left unchanged). A processor id appears at most once: its second call
    would need the state its first leaves. With `cheap_first`, a batch of cheap entries ends
    before the first judged one (a fused request runs its members in order, so a judge fused
    behind a cheap neighbour already waits for it).
    """
    first = lane[pos]
    if not isinstance(first, Batchable):
        return [[first]]
    units: list[list[Processor]] = []
    seen: set[str] = set()
    p = pos
    while p < len(lane):
        speculative_only = bool(units)
        unit: list[Processor] = []
        key = ""
        while p < len(lane):
            item = lane[p]
            if not isinstance(item, Batchable) or item.processor_id in seen:
                break
            if speculative_only and not item.speculative:
                break
            if unit and not (fuse and key and item.fuse_key == key):
                break
            unit.append(item)
            seen.add(item.processor_id)
            key = item.fuse_key
            p += 1
        if not unit:
            break
        if cheap_first and units and _judged(unit) and not any(_judged(u) for u in units):
            break
        units.append(unit)
    return units


def _judged(unit: Sequence[Processor]) -> bool:
    return any(isinstance(i, Batchable) and i.judged for i in unit)


async def _batch(
    run: RunCore,
    lane: Sequence[Processor],
    pos: int,
    build: Build[A],
    apply: Apply[A],
    step_number: int | None,
) -> int:
    """Send one batch and commit what stands; the position to go on from (len(lane): the end)."""
    units = plan(lane, pos, fuse=run.info.fuse)
    args = build(lane[pos])
    if not isinstance(lane[pos], Batchable):
        with _at_step(run, step_number):
            answer = await run.call(lane[pos], args)
        stop = answer is not None and await apply(lane[pos], args, *answer)
        return len(lane) if stop else pos + 1
    with _at_step(run, step_number):
        sent = [run.caller.send(unit, args, speculative=k > 0) for k, unit in enumerate(units)]
    context = run.info.request_context  # what the batch was sent with (a hook's value replaces it)
    committed = 0  # attempts committed, over the whole batch
    p = pos
    ended = False
    try:
        for k, unit in enumerate(units):
            attempts = await sent[k]
            for m, item in enumerate(unit):
                if p > pos and (build(item) != args or run.info.request_context is not context):
                    return p  # its input or the request context changed: it and the rest go again
                if m >= len(attempts):
                    return p  # the fused request stopped before it
                committed += 1  # before: a commit that raises (fail-closed) is not discarded too
                reply = run.commit(attempts[m])
                p += 1
                ended = True  # an abort raises out of apply: the lane ends here unless it returns False
                if reply.result is not None and await apply(item, args, reply.result, reply.effects):
                    return len(lane)
                ended = False
        return p
    finally:
        if ended:
            _count_cheap_first(run, lane, pos, units)
        await _discard(run, units, sent, committed, args.hook)


def _count_cheap_first(
    run: RunCore, lane: Sequence[Processor], pos: int, units: list[list[Processor]]
) -> None:
    """The lane ended in a batch cheap-first cut short: the judges it held back were never asked."""
    sent = {id(item) for unit in units for item in unit}
    for unit in plan(lane, pos, fuse=run.info.fuse, cheap_first=False)[len(units) :]:
        for item in unit:
            if id(item) not in sent and isinstance(item, Batchable) and item.judged:
                run.metrics.judge_calls_saved.labels(item.processor_id, "cheap-first").inc()


async def _discard(
    run: RunCore,
    units: Sequence[Sequence[Processor]],
    sent: Sequence[asyncio.Task[list[Attempt[Any]]]],
    committed: int,
    hook: str,
) -> None:
    """Drop every attempt of a batch past the first `committed`; cancel the calls still running."""
    seen = 0
    running = []
    for k, (unit, task) in enumerate(zip(units, sent, strict=True)):
        if not task.done():
            task.cancel()
            running.append(task)
            if k > 0:  # a speculative call cut short is one discarded too
                for item in unit:
                    assert isinstance(item, Batchable)
                    labels = series(run.agent.id, item.processor_id, item.source)
                    run.metrics.speculative_calls.labels(*labels, hook, "discarded").inc()
            continue
        if task.cancelled() or task.exception() is not None:
            continue
        for attempt in task.result():
            if seen >= committed:
                attempt.discard()
            seen += 1
    await asyncio.gather(*running, return_exceptions=True)


@contextlib.contextmanager
def _at_step(run: RunCore, step_number: int | None) -> Iterator[None]:
    if step_number is None:
        yield
        return
    with run.at_step(step_number):
        yield
