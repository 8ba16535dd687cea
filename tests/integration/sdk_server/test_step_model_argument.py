"""In `process_input_step`, `process_llm_request` and `process_llm_response` the ``model`` argument
is the step's model id (its request's ``model``), whatever else the hook declares: declared alone,
it was the model gateway instead (the request was not decoded for a hook declaring none of its
other fields), so the same argument changed type with its neighbours. The Node SDK always gives the
id. A real ProcessorServer over gRPC, called as the orchestrator calls it."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import Processor, convert
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

pytestmark = pytest.mark.asyncio(loop_scope="module")

seen: list[tuple[str, Any]] = []


class Alone(Processor):
    id = "alone"

    async def process_input_step(self, model: Any) -> None:
        seen.append(("process_input_step", model))

    async def process_llm_request(self, model: Any) -> None:
        seen.append(("process_llm_request", model))

    async def process_llm_response(self, model: Any) -> None:
        seen.append(("process_llm_response", model))


class WithSteps(Processor):
    id = "with-steps"

    async def process_llm_request(self, model: Any, steps: list[Any]) -> None:
        seen.append(("process_llm_request", model))


def context(pid: str) -> tpb.RunContext:
    return tpb.RunContext(processor_id=pid, run_id="run-1", agent_id="agent-1")


@pytest.mark.parametrize("pid", ["alone", "with-steps"])
async def test_the_model_argument_is_the_steps_model_id(pid: str) -> None:
    seen.clear()
    async with serve_for_test([Alone(), WithSteps()]) as client:
        await client.call(
            "ProcessLLMRequest", ppb.ProcessLLMRequestRequest(context=context(pid), model="m-1"), 5
        )
        if pid == "alone":
            step = ppb.ProcessInputStepRequest(context=context(pid), model="m-2")
            await client.call("ProcessInputStep", step, 5)
            part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "a"}})
            response = ppb.ProcessLLMResponseRequest(context=context(pid), model="m-3", chunks=[part])
            await client.call("ProcessLLMResponse", response, 5)
    expected = [("process_llm_request", "m-1")]
    if pid == "alone":
        expected += [("process_input_step", "m-2"), ("process_llm_response", "m-3")]
    assert seen == expected
