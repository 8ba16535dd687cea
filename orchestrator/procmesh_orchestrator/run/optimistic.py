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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import steps
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest


class EarlyCall:
    """A model call made before its request was final; its chunks wait for `replay`."""

    def __init__(self, model: ModelProvider, request: ModelRequest) -> None:
        self.model = model
        self.request = request
        self.chunks: list[Chunk] = []
        self.error: BaseException | None = None
        self.done = False
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

    async def replay(self) -> AsyncIterator[Chunk]:
        """The chunks so far, then the rest as they come; closing it early cancels the call."""
        i = 0
        try:
            while True:
                while i < len(self.chunks):
                    yield self.chunks[i]
                    i += 1
                if self.done:
                    if self.error is not None:
                        raise self.error
                    return
                self._more.clear()
                if i == len(self.chunks) and not self.done:
                    await self._more.wait()
        finally:
            await self.cancel()

    async def cancel(self) -> None:
        """Stop the call (the provider sees its request cancelled); nothing of it is used."""
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def start(run: RunCore) -> EarlyCall | None:
    """Step 0's model call on the input as it is now, when the agent opts in (else None)."""
    if not run.agent.optimistic_first_step:
        return None
    cfg = steps.step_config(run, run.agent.model)
    return EarlyCall(cfg.model, steps.model_request(run, msgs.build_prompt(run.system, run.ml.items), cfg))


async def stream(
    early: EarlyCall | None, model: ModelProvider, request: ModelRequest
) -> AsyncIterator[Chunk]:
    """The model call for `request`: the early one when it made exactly this call, else a new one."""
    if early is not None:
        if early.matches(model, request):
            async for chunk in early.replay():
                yield chunk
            return
        await early.cancel()
    async for chunk in model.stream(request):
        yield chunk
