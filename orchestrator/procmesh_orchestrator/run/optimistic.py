"""The optimistic first step: the first model call starts while the input processors still run.

`start` sends step 0's model request as it would be if no input processor changed anything,
before processInput runs; the chunks are kept, not shown. When step 0 reaches its model call
(`stream`), every input processor has committed: if the request built then is the one sent,
the kept chunks are replayed and the call goes on live, through the output processors as any
call; otherwise (a processor rewrote the messages, the prompt or a setting) the early call is
cancelled and a new one made on the committed request. A block (an abort, a failure) never
reaches `stream`: the run cancels the early call when it ends. Nothing of the early call
reaches the caller, and no tool runs, before every input processor committed, because only
`stream` hands its chunks on.

**Step 0's output, rehearsed.** When every processor of the output lane's stream may be given
a guess (each is speculative, as the built-in guards are), the kept chunks also go through that
lane at once (`HookCaller.rehearse`), while the input processors run: an output guard asks the
judge about the answer's first window while the input guards judge the request. Everything the
rehearsal gives (parts, effects, aborts, failures, processor states, metrics) is held. Step 0
adopts it (`adopted`) when the early call is the one it makes and every output session opened
as it would open now (`RehearsedStream.stands`); the held items then reach the run in order,
and the rest as it comes, as if the stream had started at that moment. Otherwise (the request
or the sessions' context changed, an input processor blocked, the run ended) it is cancelled
and nothing of it reaches the caller, memory or the metrics: step 0 streams the normal way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import steps
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Batchable, Chunk, Processor, RehearsedStream
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest

STREAM_HOOK = "process_output_stream"


class EarlyCall:
    """A model call made before its request was final; its chunks wait for `replay`."""

    def __init__(self, model: ModelProvider, request: ModelRequest) -> None:
        self.model = model
        self.request = request
        self.chunks: list[Chunk] = []
        self.error: BaseException | None = None
        self.done = False
        self.output: RehearsedStream | None = None
        """Step 0's output lane rehearsed on these chunks (`start`), until adopted or cancelled."""
        self._more = asyncio.Event()
        self._task = asyncio.create_task(self._pull())

    async def _pull(self) -> None:
        try:
            async for chunk in self.model.stream(self.request):
                self.chunks.append(chunk)
                self._more.set()
        except Exception as exc:  # the model's failure is the adopted call's, raised in its place
            self.error = exc
        finally:
            self.done = True
            self._more.set()

    def matches(self, model: ModelProvider, request: ModelRequest) -> bool:
        """Whether the committed call is the one this made."""
        return model is self.model and request == self.request

    async def follow(self) -> AsyncIterator[Chunk]:
        """The chunks so far, then the rest as they come, to the call's end (`error` says how)."""
        i = 0
        while True:
            while i < len(self.chunks):
                yield self.chunks[i]
                i += 1
            if self.done:
                return
            self._more.clear()
            await self._more.wait()

    async def replay(self) -> AsyncIterator[Chunk]:
        """`follow`, the call's failure raised at its place; closing it early cancels the call."""
        try:
            async for chunk in self.follow():
                yield chunk
            if self.error is not None:
                raise self.error
        finally:
            await self.stop()

    async def cancel(self) -> None:
        """Discard the call (the provider sees its request cancelled) and its rehearsed output."""
        if self.output is not None:
            output, self.output = self.output, None
            await output.cancel()
        await self.stop()

    async def stop(self) -> None:
        """Cancel the model call if it still runs (its chunks so far stay)."""
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def start(run: RunCore) -> EarlyCall | None:
    """Step 0's model call on the input as it is now, when the agent opts in (else None), and its
    output lane rehearsed on that call's chunks when the lane allows it."""
    if not run.agent.optimistic_first_step:
        return None
    cfg = steps.step_config(run, run.agent.model)
    early = EarlyCall(cfg.model, steps.model_request(run, msgs.build_prompt(run.system, run.ml.items), cfg))
    lane = _rehearsable(run)
    if lane:
        early.output = run.caller.rehearse(lane, _as_streamed(early), announce_signals=run.streaming)
    return early


def _rehearsable(run: RunCore) -> list[Processor]:
    """The output lane's stream when a rehearsal may run it, else nothing.

    Every entry that streams must take guesses: speculative (its calls may be withdrawn) and
    not a monitor (its would-be decisions are logged as they come). A run that keeps a
    decision record is not rehearsed: its record is of the calls its steps made."""
    lane = run.stream_lane()
    streaming = [p for p in lane if p.has(STREAM_HOOK)]
    takes_guesses = all(
        isinstance(p, Batchable) and p.speculative and not getattr(p, "shadow", False) for p in streaming
    )
    return lane if streaming and takes_guesses and run.info.decisions is None else []


async def _as_streamed(early: EarlyCall) -> AsyncIterator[Chunk]:
    """The early call's chunks as step 0 streams them through its output lane (`model_step`):
    its finish as the step's end, last; its failure raised where it came."""
    outcome = steps.StepOutcome()
    async for chunk in early.follow():
        if not outcome.finished(chunk):
            yield chunk
    if early.error is not None:
        raise early.error
    yield outcome.step_finish()


async def adopted(
    early: EarlyCall | None, model: ModelProvider, request: ModelRequest
) -> RehearsedStream | None:
    """Step 0's rehearsed output, when it stands for the call `request` makes (then the early
    call, which it follows, is that call); else None, the rehearsal cancelled."""
    if early is None or early.output is None:
        return None
    output, early.output = early.output, None
    if early.matches(model, request) and output.stands():
        return output
    await output.cancel()
    return None


def stream(early: EarlyCall | None, model: ModelProvider, request: ModelRequest) -> AsyncIterator[Chunk]:
    """The model call for `request`: the early one when it made exactly this call, else a new one.
    Without an early call it is the model's own stream: no generator between it and the run,
    whose every delta would resume one more."""
    if early is None:
        return model.stream(request)
    return _after_early(early, model, request)


async def _after_early(early: EarlyCall, model: ModelProvider, request: ModelRequest) -> AsyncIterator[Chunk]:
    if early.matches(model, request):
        async for chunk in early.replay():
            yield chunk
        return
    await early.cancel()
    async for chunk in model.stream(request):
        yield chunk
