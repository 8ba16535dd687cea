"""Fused unary requests: several processors of this sidecar in one call (``RunContext.fused``).

The orchestrator fuses consecutive lane entries this sidecar serves. Each processor runs exactly
as its own call would (own options, state, effects, span, metrics, hook loop), one after another
on the same request, and the chain goes on only while each leaves its input as it came: no
result field set, no signal, no abort, no failure. Then the next one's input is the request
itself, so nothing is re-encoded between them. The answer carries the result fields of the last
one that ran, the first one's effects, and ``effects.fused[i]`` for ``context.fused[i]``; the
orchestrator calls the rest itself (proto/README.md, "Fused processors"). A hook that sets a
request-context value ends the chain too: the next one would not see the value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from procmesh._guard import clip
from procmesh.errors import ProcmeshError
from procmesh.hooks import Hook

if TYPE_CHECKING:
    from procmesh._hosted import Hosted
    from procmesh._servicer import Context, Servicer


def passes(response: Any) -> bool:
    """The hook left its input as it came: no result field, no signal, no request-context value
    (the next one would not see it), no abort."""
    effects = response.effects
    if effects.signals or effects.HasField("abort") or effects.HasField("request_context_updates"):
        return False
    return all(field.name == "effects" for field, _ in response.ListFields())


async def run_fused(servicer: Servicer, first: Hosted, hook: Hook, request: Any, context: Context) -> Any:
    """Run `first` and then ``request.context.fused`` in order, while each passes its input on.

    Every processor named is looked up before any runs (unknown: NOT_FOUND, no such hook:
    UNIMPLEMENTED), so a bad request runs nothing. The first processor's failure fails the call
    as its own call would; a later one's is its outcome's ``error`` and ends the chain.
    """
    members = request.context.fused
    chain = servicer.lookup_fused(request.context, hook.name)
    response = await servicer.run_hook(first, hook, request, context)
    if not passes(response):
        return response
    for member, hosted in zip(members, chain, strict=True):
        outcome = response.effects.fused.add()
        try:
            answer = await servicer.run_hook(hosted, hook, request, context, member)
        except ProcmeshError as exc:
            outcome.error = f"{exc.code.name}: {clip(str(exc))}"
            break
        outcome.effects.CopyFrom(answer.effects)
        if not passes(answer):
            # Its result fields are the answer's (everything before it set none), with the effects so far.
            answer.effects.CopyFrom(response.effects)
            return answer
    return response
