"""A custom chunk a unary hook writes goes through the output processors, and one of them may end
the run on it: the abort is the run's tripwire, never dropped.

Real processors on a real gRPC server, an `App` streaming with the scripted model: `noter` writes
a ``data-note`` chunk from ``process_input_step`` (``process_input``'s chunks
are not streamed: the stream has not begun); `stopper` (it takes ``data-*`` parts) aborts on it.
"""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run import CallOptions

pytestmark = [pytest.mark.asyncio]


class Noter(Processor):
    id = "noter"

    async def process_input_step(self, writer: Any) -> None:
        await writer.custom({"type": "data-note", "data": {"secret": True}})


class Stopper(Processor):
    id = "stopper"
    process_data_parts = True

    async def process_output_stream(self, part: dict[str, Any], abort: Any) -> dict[str, Any]:
        if part["type"] == "data-note":
            abort("a note is not allowed out", metadata={"type": part["type"]})
        return part


async def test_an_output_processor_that_aborts_on_a_hooks_chunk_ends_the_run() -> None:
    violations: list[dict[str, Any]] = []
    async with ProcessorServer([Noter(), Stopper()], ["127.0.0.1:0"]) as sidecar:
        config = parse_config(
            {
                "sidecars": {"s": {"address": sidecar.addresses[0]}},
                "models": {"m": {"provider": "scripted", "responses": [{"text": "never said"}]}},
                "agents": {
                    "a": {
                        "model": "m",
                        "errorProcessorDefaults": False,
                        "inputProcessors": ["s/noter"],
                        "outputProcessors": ["s/stopper"],
                    }
                },
            },
            "test config",
        )
        async with App(config) as app:
            run = app.agent("a").stream("hi", CallOptions(on_violation=violations.append))
            chunks = [chunk async for chunk in run]
            result = await run.result()
            model = app.models["m"]
    kinds = [c["type"] for c in chunks]
    assert "data-note" not in kinds, kinds  # the stopped chunk never reached the caller
    assert "text-delta" not in kinds, kinds
    assert result.status == "tripwire", result
    assert result.tripwire is not None
    assert (result.tripwire["processorId"], result.tripwire["reason"]) == (
        "stopper",
        "a note is not allowed out",
    )
    assert [v["processorId"] for v in violations] == ["stopper"]
    assert model.requests == []  # type: ignore[attr-defined]  # the run ended before the model
