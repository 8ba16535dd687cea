"""The Python SDK's `request_context.set` over a real in-process server: the hook's answer carries
the values (``HookEffects.request_context_updates``), a fused chain stops after the hook that set
one, and what cannot be sent (a removal, a non-JSON value, a value set in an output stream) fails
the hook instead of vanishing."""

from __future__ import annotations

from typing import Any, ClassVar

import grpc
import pytest

from procmesh import Processor, convert
from procmesh.errors import ProcmeshError
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

TIMEOUT = 5.0


class Tagger(Processor):
    id = "tagger"

    async def process_input(self, request_context: dict[str, Any]) -> None:
        request_context.set("tier", "gold")  # type: ignore[attr-defined]
        request_context["seen"] = sorted(request_context)


class Reader(Processor):
    id = "reader"
    calls: ClassVar[list[dict[str, Any]]] = []

    async def process_input(self, request_context: dict[str, Any]) -> None:
        Reader.calls.append(dict(request_context))


class Remover(Processor):
    id = "remover"

    async def process_input(self, request_context: dict[str, Any]) -> None:
        del request_context["tenant"]


class NotJson(Processor):
    id = "notjson"

    async def process_input(self, request_context: dict[str, Any]) -> None:
        request_context["when"] = object()


def request(processor_id: str, *fused: str) -> ppb.ProcessInputRequest:
    ctx = tpb.RunContext(processor_id=processor_id, run_id="r1", agent_id="a")
    ctx.request_context.CopyFrom(convert.to_struct({"tenant": "acme"}))
    for member in fused:
        ctx.fused.add(processor_id=member)
    return ppb.ProcessInputRequest(context=ctx)


async def test_the_answer_carries_the_values_the_hook_set() -> None:
    async with serve_for_test([Tagger()]) as client:
        answer = await client.call("ProcessInput", request("tagger"), TIMEOUT)
    assert convert.from_struct(answer.effects.request_context_updates) == {
        "tier": "gold",
        "seen": ["tenant", "tier"],
    }


async def test_a_fused_chain_stops_after_a_hook_that_set_a_value() -> None:
    Reader.calls = []
    async with serve_for_test([Tagger(), Reader()]) as client:
        answer = await client.call("ProcessInput", request("tagger", "reader"), TIMEOUT)
        assert len(answer.effects.fused) == 0  # the orchestrator calls reader itself, with the value
        assert Reader.calls == []
        passed = await client.call("ProcessInput", request("reader", "tagger"), TIMEOUT)
    assert Reader.calls == [{"tenant": "acme"}]
    assert not passed.HasField("effects") or not passed.effects.HasField("request_context_updates")
    (tagged,) = passed.effects.fused
    assert convert.from_struct(tagged.effects.request_context_updates)["tier"] == "gold"


@pytest.mark.parametrize(
    ("processor", "message"),
    [(Remover(), "cannot remove request-context keys"), (NotJson(), "the value must be JSON")],
)
async def test_what_cannot_be_sent_fails_the_hook(processor: Processor, message: str) -> None:
    async with serve_for_test([processor]) as client:
        with pytest.raises(ProcmeshError, match=message) as failed:
            await client.call("ProcessInput", request(processor.id), TIMEOUT)
    assert failed.value.code == grpc.StatusCode.INTERNAL
