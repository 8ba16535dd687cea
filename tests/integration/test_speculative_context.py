"""A speculative call made before an earlier processor set a request-context value is called again.

Both processors are speculative, so one batch sends them together with the run's request context
as it was; `tagger` then commits a value (``request_context.set``). The `gate`'s input messages
are unchanged, but what it was given is not what it would be given now: its speculative answer
must be discarded and the call made again with the value (the sequential trace), never kept.
Real processors on a real gRPC server, an `App` with the scripted model; fused or not.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config

pytestmark = [pytest.mark.asyncio]


class Tagger(Processor):
    id = "tagger"
    speculative = True

    async def process_input(self, request_context: dict[str, Any]) -> None:
        request_context["tier"] = "gold"


class Gate(Processor):
    """Lets only a gold tier through; records the tier of every call it was given."""

    id = "gate"
    speculative = True
    seen: ClassVar[list[Any]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    async def process_input(self, request_context: dict[str, Any], abort: Any) -> None:
        with Gate.lock:
            Gate.seen.append(request_context.get("tier"))
        if request_context.get("tier") != "gold":
            abort("no tier")


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("speculative", [False, None], ids=["sequential", "speculative"])
async def test_a_value_an_earlier_answer_set_reaches_the_speculative_call_after_it(
    fuse: bool, speculative: bool | None
) -> None:
    def ref(pid: str) -> dict[str, Any]:
        return (
            {"processor": f"s/{pid}"}
            if speculative is None
            else {"processor": f"s/{pid}", "speculative": False}
        )

    Gate.seen.clear()
    async with ProcessorServer([Tagger(), Gate()], ["127.0.0.1:0"]) as sidecar:
        config = parse_config(
            {
                "sidecars": {"s": {"address": sidecar.addresses[0]}},
                "fuse": fuse,
                "models": {"m": {"provider": "scripted", "responses": [{"text": "welcome"}]}},
                "agents": {
                    "a": {
                        "model": "m",
                        "errorProcessorDefaults": False,
                        "inputProcessors": [ref("tagger"), ref("gate")],
                    }
                },
            },
            "test config",
        )
        async with App(config) as app:
            result = await app.agent("a").generate("hi")
    assert result.tripwire is None, result.tripwire
    assert result.text == "welcome"
    # Speculative, unfused: sent with the batch before the value existed, then again with it (the
    # batch really speculated). Fused, the chain stops after the hook that set a value, so the gate
    # goes once, in a new request; sequential, once.
    assert Gate.seen == ([None, "gold"] if speculative is None and not fuse else ["gold"])
