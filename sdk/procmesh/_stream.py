"""The bidirectional ProcessOutputStream: parts in batches, one result per part, then StreamEnd.

Unlike the unary hooks, one call serves many parts: the arguments every hook gets are built
once from the first request's context, ``state`` and ``stream_parts`` live for the whole
stream, and each part gets fresh effects (its abort, signals, custom chunks, violations).
A whole batch is handled in one trip to the processor's hook loop (`HookLoop`), not one per
part: the orchestrator batches whatever is queued, so the thread hop is paid once per batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc

from procmesh import convert, tracing
from procmesh._encode import fill_effects
from procmesh._guard import MALFORMED, clip, decode
from procmesh._processor import HookEffects, Writer
from procmesh.errors import ProcmeshError
from procmesh.hooks import Hook
from procmesh.v1 import processor_pb2 as ppb

if TYPE_CHECKING:
    from procmesh._hosted import Hosted
    from procmesh._servicer import Context, Servicer

StreamHandler = Callable[[AsyncIterator[bytes], "Context"], AsyncIterator[ppb.ProcessOutputStreamResponse]]


def output_stream_handler(servicer: Servicer, hook: Hook) -> StreamHandler:
    """The stream-stream handler for `hook` (an async generator function, as grpc.aio expects)."""
    name = hook.name

    async def batch(
        hosted: Hosted, req: ppb.ProcessOutputStreamRequest, kwargs: dict[str, Any], stream_parts: list[Any]
    ) -> tuple[list[ppb.StreamPartResult], bool]:
        """One request's parts through the hook (runs on the hook loop); True when one aborted."""
        results = []
        for item in req.parts:
            decoded = hook.decode(item)
            part = decoded["part"]
            if part["type"].startswith("data-") and not hosted.processor.process_data_parts:
                passed = ppb.StreamPartResult(seq=item.seq)
                passed.part.CopyFrom(item.part)
                results.append(passed)
                continue
            stream_parts.append(part)
            effects = HookEffects(hosted.id)
            kwargs.update(
                decoded,
                abort=effects.abort_hook,
                send_signal=effects.send_signal,
                writer=Writer(effects),
                report_violation=effects.report_violation,
            )
            out = await servicer.invoke(hosted, name, kwargs, effects)
            res = ppb.StreamPartResult() if effects.abort is not None else hook.encode(out, kwargs)
            res.seq = item.seq
            fill_effects(res.effects, effects, None)
            results.append(res)
            if effects.abort is not None:
                return results, True
        return results, False

    async def handle(
        request_iterator: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[ppb.ProcessOutputStreamResponse]:
        hosted: Hosted | None = None
        kwargs: dict[str, Any] = {}
        stream_parts: list[dict[str, Any]] = []
        # One span for the session; not current: it lives across this generator's yields.
        span = tracing.Span()
        try:
            async for raw in request_iterator:
                req = decode(hook.request, raw, name, servicer.rejects)
                if hosted is None:
                    hosted = servicer.lookup(req.context, name)
                    kwargs = servicer.base_kwargs(hosted, req.context, HookEffects(hosted.id))
                    kwargs["stream_parts"] = stream_parts
                    span = tracing.start(
                        f"procmesh.hook {name} {hosted.id}",
                        kind="server",
                        attributes={"procmesh.hook": name, "procmesh.processor.id": hosted.id},
                        parent=context.invocation_metadata() if tracing.enabled() else None,
                    )
                    span.outcome("pass")
                results, aborted = await hosted.loop.run(partial(batch, hosted, req, kwargs, stream_parts))
                yield ppb.ProcessOutputStreamResponse(results=results)
                if aborted:
                    span.outcome("abort")
                    break
            end = ppb.StreamEnd(state=convert.to_struct(kwargs.get("state")))
            yield ppb.ProcessOutputStreamResponse(end=end)
            # After an abort the call stays open until the client half-closes or cancels:
            # ending it first can fail a write the client has in flight, and grpc clients
            # then report that failure instead of the abort they have not read yet.
            async for _ in request_iterator:
                pass
        except ProcmeshError as exc:
            span.outcome("failure")
            await context.abort(exc.code, clip(str(exc)))
        except MALFORMED as exc:
            span.outcome("failure")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clip(servicer.malformed(name, exc)))
        finally:
            span.end()

    return handle
