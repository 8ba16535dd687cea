"""The bidirectional ProcessOutputStream: parts in batches, their results in order, then StreamEnd.

Unlike the unary hooks, one call serves many parts: the arguments every hook gets are built
once from the first request's context, ``state`` and ``stream_parts`` live for the whole
stream, and each part gets fresh effects (its abort, signals, custom chunks, violations).
A whole batch is handled in one trip to the processor's hook loop (`HookLoop`), not one per
part: the orchestrator batches whatever is queued, so the thread hop is paid once per batch.

A fused stream (``context.fused``) runs each part through every processor it names (`_chain`).
A stream whose processors are all speculative keeps what undoes its uncommitted batches
(`_rewind`), so ``rewind_to`` can withdraw parts; any other stream refuses it.

A hook that declares ``release`` may let parts go while it is processing a part (a guard whose
window's verdict came): on a stream whose orchestrator takes partial results
(``partial_results``) and that runs one processor, each ``release(parts)`` is sent at once as a
partial result (``more``) behind the batch's results so far (`_Outbox`); otherwise what it let go
leads the part's result, as if returned first, so the stream is the same either way.

On a stream whose orchestrator takes them (``unchanged_results``), a run of parts a hook gave
back as they came, with no effects, is answered by one result (``unchanged_through``): nothing of
them is encoded or sent back (`procmesh._chain.Results`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from procmesh import convert, tracing
from procmesh._chain import Results, pristine, returned_chunks, through_all
from procmesh._convert.chunks import chunk_from_proto
from procmesh._encode import fill_effects
from procmesh._guard import MALFORMED, clip, decode
from procmesh._hosted import STREAM_HOOK, Tally
from procmesh._logging import RUN_ID
from procmesh._model import hook_span
from procmesh._processor import HookEffects, Writer
from procmesh._rewind import History
from procmesh.errors import FailedPreconditionError, ProcmeshError
from procmesh.hooks import Hook
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    from procmesh._hosted import Hosted
    from procmesh._servicer import Context, Servicer

StreamHandler = Callable[[AsyncIterator[bytes], "Context"], AsyncIterator[ppb.ProcessOutputStreamResponse]]


_PER_PART = frozenset({"abort", "send_signal", "writer", "report_violation", "release"})
"""A stream hook's arguments bound to each part's own effects."""


class Stage:
    """One processor of a stream session: its arguments for the whole stream and what it has seen."""

    __slots__ = (
        "aborted",
        "data_parts",
        "error",
        "hosted",
        "keeps_parts",
        "kwargs",
        "stream_parts",
        "tally",
        "wants",
    )

    def __init__(self, servicer: Servicer, hosted: Hosted, ctx: tpb.RunContext, member: Any = None) -> None:
        self.hosted = hosted
        session = HookEffects(hosted.id)
        session.context_updates = None  # request_context.set raises: a stream part cannot set values
        self.kwargs = servicer.base_kwargs(hosted, ctx, session, member)
        self.stream_parts: list[Any] = []
        self.kwargs["stream_parts"] = self.stream_parts
        self.data_parts = hosted.processor.process_data_parts
        self.error = ""
        """Why its hook failed (a fused stream's further processor then passes parts through)."""
        self.aborted = False
        """Its hook aborted (the session's call is counted as its abort)."""
        self.tally = Tally(hosted.series[STREAM_HOOK])
        """The current batch's parts through its hook; its latency observed at the batch's end."""
        params = hosted.params[STREAM_HOOK]
        self.wants = _PER_PART if params is None else _PER_PART & params
        """The arguments made afresh for each part that its hook declares (`_Session.call`)."""
        self.keeps_parts = params is None or "stream_parts" in params
        """Its hook declares ``stream_parts``: the parts so far are kept for it. A hook that does
        not never sees them, and keeping every part of a stream to its end cost a sidecar memory
        and its garbage collector's time (each part's dicts traversed again and again)."""

    def takes(self, kind: str) -> bool:
        """Whether a chunk of this type goes to its hook."""
        return not self.error and (self.data_parts or not kind.startswith("data-"))


class _Outbox:
    """Partial results a hook let go, for the server loop to send while the batch goes on.

    `put` may be called from the hook loop's thread: the results go in a deque (appends are
    atomic) and the server loop is woken; everything put before the batch ended is in the deque
    when the server loop sees the batch end, so nothing is sent out of order.
    """

    def __init__(self) -> None:
        self.items: deque[list[ppb.StreamPartResult]] = deque()
        self.loop = asyncio.get_running_loop()
        self.wake: asyncio.Future[None] | None = None

    def put(self, results: list[ppb.StreamPartResult]) -> None:
        self.items.append(results)
        self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)


class Release:
    """A hook's ``release(parts)``: let parts go now, ahead of the rest of the part's answer.

    `parts` is what a hook may return (a chunk, a list of them, or None). Sent at once as a
    partial result when the stream takes them (`_Session.partial`), with the signals, custom
    chunks and violations the hook produced so far; otherwise kept (`kept`) to lead its result.
    After an abort nothing more goes out.
    """

    __slots__ = ("_effects", "_hook", "_send", "kept")

    def __init__(
        self,
        effects: HookEffects,
        hook: str,
        send: Callable[[list[dict[str, Any]], HookEffects], None] | None,
    ) -> None:
        self._effects = effects
        self._hook = hook
        self._send = send
        self.kept: list[dict[str, Any]] = []

    def __call__(self, parts: Any) -> None:
        chunks = returned_chunks(parts, self._hook)
        if self._effects.abort is not None:
            return
        if self._send is None or self.kept:
            self.kept += chunks
        elif chunks:
            self._send(chunks, self._effects)


class _Session:
    """One ProcessOutputStream call's processors, their hook calls, and its rewind history."""

    def __init__(self, servicer: Servicer, hook: Hook, req: ppb.ProcessOutputStreamRequest) -> None:
        ctx = req.context
        self.servicer = servicer
        self.hook = hook
        first = servicer.lookup(ctx, hook.name)
        fused = servicer.lookup_fused(ctx, hook.name)
        self.stages = [Stage(servicer, first, ctx)]
        self.stages += [Stage(servicer, h, ctx, m) for h, m in zip(fused, ctx.fused, strict=True)]
        self.announce = ctx.announce_signals
        speculative = all(s.hosted.processor.speculative for s in self.stages)
        self.history = History(self.stages) if speculative else None
        params = first.params[hook.name]
        self.outbox: _Outbox | None = None
        """Partial results to send (a stream that takes them, of one processor whose hook releases)."""
        if req.partial_results and not fused and (params is None or "release" in params):
            self.outbox = _Outbox()
        self.unchanged = req.unchanged_results
        """The orchestrator takes a run of unchanged parts as one result (`Results`)."""
        self._results = Results(self.unchanged)
        """The batch's results not sent yet (`_alone`): a partial result goes behind them."""
        self._seq = 0
        """The seq of the part being processed (`_alone`)."""
        self._partial_seq = 0
        """The seq of the last part a partial result was sent for (its answer is never
        ``unchanged_through``: it completes the parts sent before it)."""

    async def call(self, stage: Stage, part: dict[str, Any], effects: HookEffects, quiet: bool) -> Any:
        """One part through one processor's hook (on its hook loop)."""
        if stage.keeps_parts:
            stage.stream_parts.append(part)
        kwargs = stage.kwargs
        kwargs["part"] = part
        wants, release = stage.wants, None
        if wants:  # only the per-part arguments its hook declares are made
            if "abort" in wants:
                kwargs["abort"] = effects.abort_hook
            if "send_signal" in wants:
                kwargs["send_signal"] = effects.send_signal
            if "writer" in wants:
                kwargs["writer"] = Writer(effects)
            if "report_violation" in wants:
                kwargs["report_violation"] = effects.report_violation
            if "release" in wants:
                send = self._send_partial if self.outbox is not None and not quiet else None
                release = kwargs["release"] = Release(effects, self.hook.name, send)
        out = await self.servicer.invoke(
            stage.hosted, self.hook.name, kwargs, effects, quiet=quiet, tally=stage.tally
        )
        if effects.abort is not None and not quiet:
            stage.aborted = True
        if release is not None and release.kept and effects.abort is None:  # let go as if returned first
            out = release.kept + returned_chunks(out, self.hook.name)
        return out

    def _send_partial(self, chunks: list[dict[str, Any]], effects: HookEffects) -> None:
        """A partial result for the part being processed: the effects so far, then `chunks`;
        sent behind the batch's results before it."""
        assert self.outbox is not None
        res = self.hook.encode(chunks, self.stages[0].kwargs)
        res.seq = self._seq
        res.more = True
        fill_effects(res.effects, effects, None)
        effects.signals, effects.custom_chunks, effects.violations = [], [], []
        self._partial_seq = self._seq
        self.outbox.put([*self._results.take(), res])

    def batch(self, items: Any, *, quiet: bool = False) -> Awaitable[tuple[list[ppb.StreamPartResult], bool]]:
        """One request's parts through the processors, to be awaited at once; True when one
        aborted (the stream ends). Each processor observes its latency once for the batch, at its
        end (`Tally`)."""
        if len(self.stages) > 1:
            return through_all(
                self.stages,
                items,
                self.call,
                hook=self.hook.name,
                announce=self.announce,
                quiet=quiet,
                unchanged=self.unchanged,
            )
        stage = self.stages[0]
        return stage.hosted.loop.run(lambda: self._alone(stage, items, quiet))

    async def _alone(self, stage: Stage, items: Any, quiet: bool) -> tuple[list[ppb.StreamPartResult], bool]:
        """A stream of one processor (runs on its hook loop): parts stay protobuf where they pass."""
        # A hook given no per-part effect argument can only abort (a TripWire). Such a hook that
        # keeps no parts so far, on a call that is timed and counted, takes the lean loop.
        reuse = not stage.wants
        params = stage.hosted.params[self.hook.name]
        if reuse and not quiet and not stage.keeps_parts and params is not None:
            return await self._lean(stage, items, params)
        results = self._results
        results.take()
        takes, call, unchanged, pid = stage.takes, self.call, self.unchanged, stage.hosted.id
        spare: HookEffects | None = None  # quiet effects serve the next part too (`reuse`)
        try:
            for item in items:
                seq = self._seq = item.seq
                part = item.part
                if not takes(part.type):
                    results.passed(seq, part)
                    continue
                chunk = chunk_from_proto(part)
                before = pristine(chunk, part) if unchanged else None
                effects = spare or HookEffects(pid)
                out = await call(stage, chunk, effects, quiet)
                if effects.quiet():
                    spare = effects if reuse else None
                    if before is not None and out == before and self._partial_seq != seq:
                        results.passed(seq, part)
                        continue
                else:
                    spare = None
                aborted = effects.abort is not None
                res = ppb.StreamPartResult() if aborted else self.hook.encode(out, stage.kwargs)
                res.seq = seq
                if not effects.quiet():
                    fill_effects(res.effects, effects, None)
                results.append(res)  # behind those a partial result did not send
                if aborted:
                    return results.take(), True
            return results.take(), False
        finally:
            stage.tally.end()

    async def _lean(
        self, stage: Stage, items: Any, params: frozenset[str]
    ) -> tuple[list[ppb.StreamPartResult], bool]:
        """`_alone` for a hook given no per-part argument but its part, keeping no parts, on a call
        timed and counted: the common pass-through processor (bench P2). Its arguments are made
        once for the batch; each part's hook is awaited and timed here (`Servicer.settle` for
        what it raises: no coroutine of ours a part); a text delta is converted here and told
        given back as it came (the very dicts and strings it was given, or an equal answer)
        from its original strings, with no copy made beforehand (`pristine`); its effects exist
        only once it aborts."""
        results = self._results
        results.take()
        hosted, name, kwargs = stage.hosted, self.hook.name, stage.kwargs
        hook, encode, takes, unchanged = hosted.hooks[name], self.hook.encode, stage.takes, self.unchanged
        args = {k: kwargs[k] for k in params if k != "part"}
        takes_part = "part" in params
        clock, tally = time.perf_counter, stage.tally
        ok, took = 0, 0.0
        try:
            for item in items:
                seq = self._seq = item.seq
                part = item.part
                kind = part.type
                if not takes(kind):
                    results.passed(seq, part)
                    continue
                payload: dict[str, Any] | None = None
                if unchanged and part.WhichOneof("payload") == "text_delta" and not part.transient:
                    delta = part.text_delta
                    text, tid = delta.text, delta.id
                    payload = {"text": text, "id": tid} if tid else {"text": text}
                    chunk: dict[str, Any] = {"type": kind, "payload": payload}
                else:
                    chunk = chunk_from_proto(part)
                if takes_part:
                    args["part"] = chunk
                started = clock()
                try:
                    out = await hook(**args)
                except BaseException as exc:
                    effects = HookEffects(hosted.id)
                    self.servicer.settle(hosted, name, exc, effects, tally.add, clock() - started)
                    stage.aborted = True  # a TripWire: anything else was raised
                    res = ppb.StreamPartResult(seq=seq)
                    fill_effects(res.effects, effects, None)
                    results.append(res)
                    return results.take(), True
                took += clock() - started
                ok += 1
                if payload is not None and (
                    (  # the very dicts and strings it was given, none added or taken away
                        out is chunk
                        and len(chunk) == 2
                        and chunk.get("type") is kind
                        and chunk.get("payload") is payload
                        and payload.get("text") is text
                        and len(payload) == (2 if tid else 1)
                        and (not tid or payload.get("id") is tid)
                    )
                    or out == {"type": kind, "payload": {"text": text, "id": tid} if tid else {"text": text}}
                ):
                    results.passed(seq, part)
                    continue
                res = encode(out, kwargs)
                res.seq = seq
                results.append(res)
            return results.take(), False
        finally:
            tally.passed(ok, took)
            tally.end()

    async def answer(self, req: ppb.ProcessOutputStreamRequest) -> tuple[list[ppb.StreamPartResult], bool]:
        """A request: its rewind, its commit, then its parts."""
        if req.rewind_to or req.committed_through:
            if self.history is None:
                field = "rewind_to" if req.rewind_to else "committed_through"
                raise FailedPreconditionError(
                    f"{field} is only for speculative processors; not speculative: "
                    f"{[s.hosted.id for s in self.stages if not s.hosted.processor.speculative]}"
                )
            if req.rewind_to:
                await self.history.rewind(req.rewind_to, lambda kept: self.batch(kept, quiet=True))
            if req.committed_through:
                self.history.commit(req.committed_through)
        if self.history is not None:
            self.history.keep(req.parts)
        return await self.batch(req.parts)

    def count(self, outcome: str) -> None:
        """Count the session as one call of each of its processors: `outcome`, or abort for one
        whose hook aborted, or the hook's error for one whose hook failed."""
        for stage in self.stages:
            own = outcome
            if stage.aborted:
                own = "abort"
            elif stage.error and outcome == "ok":  # a fused stream went on past its failed hook
                own = stage.error.partition(":")[0].lower()
            stage.hosted.session_ended(self.servicer.metrics, own)

    def end(self) -> ppb.StreamEnd:
        """The StreamEnd: every processor's state (the further ones' in ``fused_states``)."""
        first, *others = self.stages
        end = ppb.StreamEnd(state=convert.to_struct(first.kwargs.get("state")))
        for stage in others:
            end.fused_states.add().CopyFrom(convert.to_struct(stage.kwargs.get("state")))
        return end


def output_stream_handler(servicer: Servicer, hook: Hook) -> StreamHandler:
    """The stream-stream handler for `hook` (an async generator function, as grpc.aio expects)."""
    name = hook.name

    async def handle(
        request_iterator: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[ppb.ProcessOutputStreamResponse]:
        session: _Session | None = None
        # One span for the session; not current: it lives across this generator's yields.
        span = tracing.Span()
        outcome = "cancelled"  # the call was cancelled, or its deadline passed, unless set below
        try:
            async for raw in request_iterator:
                req = decode(hook.request, raw, name, servicer.rejects)
                if session is None:
                    session = _Session(servicer, hook, req)
                    RUN_ID.set(req.context.run_id)  # its hooks' log lines name the run
                    pid = session.stages[0].hosted.id
                    span = tracing.start(
                        f"procmesh.hook {name} {pid}",
                        kind="server",
                        attributes={"procmesh.hook": name, "procmesh.processor.id": pid},
                        parent=context.invocation_metadata() if tracing.enabled() else None,
                    )
                    span.outcome("pass")
                    hook_span.set(span)  # its parts' pre-checks count their saved judge calls on it
                if session.outbox is None:
                    results, aborted = await session.answer(req)
                else:  # partial results go out while the batch is processed
                    outbox = session.outbox
                    batch = asyncio.ensure_future(session.answer(req))
                    try:
                        while not batch.done():
                            outbox.wake = outbox.loop.create_future()
                            if not outbox.items:
                                waits: set[asyncio.Future[Any]] = {batch, outbox.wake}
                                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                            while outbox.items:
                                yield ppb.ProcessOutputStreamResponse(results=outbox.items.popleft())
                    finally:
                        batch.cancel()
                    while outbox.items:
                        yield ppb.ProcessOutputStreamResponse(results=outbox.items.popleft())
                    results, aborted = batch.result()
                yield ppb.ProcessOutputStreamResponse(results=results)
                if aborted:
                    span.outcome("abort")
                    break
            end = session.end() if session is not None else ppb.StreamEnd()
            outcome = "ok"
            yield ppb.ProcessOutputStreamResponse(end=end)
            # After an abort the call stays open until the client half-closes or cancels:
            # ending it first can fail a write the client has in flight, and grpc clients
            # then report that failure instead of the abort they have not read yet.
            async for _ in request_iterator:
                pass
        except ProcmeshError as exc:
            span.outcome("failure")
            outcome = exc.code.name.lower()
            await context.abort(exc.code, clip(str(exc)))
        except MALFORMED as exc:
            span.outcome("failure")
            outcome = "invalid_argument"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clip(servicer.malformed(name, exc)))
        finally:
            span.end()
            if session is not None:
                session.count(outcome)

    return handle
