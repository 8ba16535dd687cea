"""The bidirectional ProcessOutputStream: parts in batches, one result per part, then StreamEnd.

Unlike the unary hooks, one call serves many parts: the arguments every hook gets are built
once from the first request's context, ``state`` and ``stream_parts`` live for the whole
stream, and each part gets fresh effects (its abort, signals, custom chunks, violations).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from procmesh import convert
from procmesh._encode import fill_effects
from procmesh._processor import HookEffects, Writer
from procmesh.errors import ProcmeshError
from procmesh.hooks import Hook
from procmesh.v1 import processor_pb2 as ppb

if TYPE_CHECKING:
    from procmesh._hosted import Hosted
    from procmesh._servicer import Context, Servicer

StreamHandler = Callable[
    [AsyncIterator[ppb.ProcessOutputStreamRequest], "Context"], AsyncIterator[ppb.ProcessOutputStreamResponse]
]


def output_stream_handler(servicer: Servicer, hook: Hook) -> StreamHandler:
    """The stream-stream handler for `hook` (an async generator function, as grpc.aio expects)."""
    name = hook.name

    async def handle(
        request_iterator: AsyncIterator[ppb.ProcessOutputStreamRequest], context: Context
    ) -> AsyncIterator[ppb.ProcessOutputStreamResponse]:
        hosted: Hosted | None = None
        kwargs: dict[str, Any] = {}
        stream_parts: list[dict[str, Any]] = []
        try:
            async for req in request_iterator:
                if hosted is None:
                    hosted = servicer.lookup(req.context, name)
                    effects = HookEffects(hosted.id)
                    kwargs = servicer.base_kwargs(hosted, req.context, effects)
                    kwargs["stream_parts"] = stream_parts
                results = []
                aborted = False
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
                    out = await servicer.call_hook(hosted, name, kwargs, effects)
                    res = ppb.StreamPartResult() if effects.abort is not None else hook.encode(out, kwargs)
                    res.seq = item.seq
                    fill_effects(res.effects, effects, None)
                    results.append(res)
                    if effects.abort is not None:
                        aborted = True
                        break
                yield ppb.ProcessOutputStreamResponse(results=results)
                if aborted:
                    break
            end = ppb.StreamEnd(state=convert.to_struct(kwargs.get("state")))
            yield ppb.ProcessOutputStreamResponse(end=end)
        except ProcmeshError as exc:
            await context.abort(exc.code, str(exc))
        except (ValueError, TypeError, KeyError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {name} request: {exc}")

    return handle
