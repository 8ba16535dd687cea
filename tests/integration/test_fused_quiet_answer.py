"""A fused session whose processors all pass a part on answers with the effects the orchestrator
commits at once (`Member.quiet`, issue 32 P7): one empty outcome per further processor, nothing
else. Should the SDK's encoding of such an answer change, the orchestrator would still be right
(anything else goes the long way) but every fused pass-through part would cost it the long way.
"""

from __future__ import annotations

from typing import Any

from procmesh import Processor, convert
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.processors.speculative_member import quiet_effects


class Passing(Processor):
    """Hands every part on unchanged, as each of a fused pass-through lane's processors does."""

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return part


async def test_a_fused_pass_through_answer_carries_exactly_the_quiet_effects() -> None:
    async with serve_for_test([type(pid, (Passing,), {"id": pid})() for pid in ("x", "y", "z")]) as client:
        call = client.open_stream(30)
        part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "a"}})
        request = ppb.ProcessOutputStreamRequest(parts=[ppb.StreamPart(seq=1, part=part)])
        request.context.CopyFrom(tpb.RunContext(processor_id="x", run_id="run-1", agent_id="agent-1"))
        for member in ("y", "z"):
            request.context.fused.add(processor_id=member)
        await call.write(request)
        answer = await call.read()
        call.cancel()
    (result,) = answer.results
    assert result.part == part
    assert result.effects == quiet_effects(3)
    assert quiet_effects(1) == tpb.HookEffects()
