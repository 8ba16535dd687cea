"""A batch of large parts goes to a stream processor in several requests, each under
`MAX_REQUEST_BYTES` (`stream_call.encode_parts`): a model streaming large parts fast (files, big
data parts, long deltas) never makes a request larger than a sidecar takes. Before, the parts
waiting together went in one request, and 300 deltas of 80 KB made one of 20 MB, which gRPC
refused (RESOURCE_EXHAUSTED) and the run failed.

Real sidecars over real gRPC (ProcessorServer), each taking messages up to 2 MiB; the lanes: a
speculative group, a plain (not speculative) stage, and a fused session."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from procmesh import Processor, ProcessorServer, convert
from procmesh_orchestrator import Agent, App, CallOptions, ScriptedModel
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.processors.stream_call import MAX_REQUEST_BYTES, encode_parts

SIDECAR_MAX = 2 * MAX_REQUEST_BYTES
"""What each sidecar takes: one request of every waiting part is several times more."""

DELTAS = [f"{i:04d}" + "x" * 40_000 for i in range(120)]
"""4.8 MB of deltas the scripted model streams at once (they wait together: one batch)."""


class Passing(Processor):
    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return part


class SpeculativePassing(Passing):
    speculative = True


class Marking(Processor):
    """Rewrites each delta (its answers are as large as the parts): the rewrite must show."""

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        if part["type"] == "text-delta":
            part["payload"]["text"] = part["payload"]["text"][:4] + "y" * 40_000
        return part


def hosted(kind: type[Processor], *ids: str) -> list[Processor]:
    return [type(pid, (kind,), {"id": pid})() for pid in ids]


@contextlib.asynccontextmanager
async def lane(*sidecars: list[Processor]) -> AsyncIterator[Agent]:
    """An agent whose output lane is every processor of `sidecars` (each sidecar's own server)."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                ProcessorServer(processors, ["127.0.0.1:0"], max_message_bytes=SIDECAR_MAX)
            )
            for processors in sidecars
        ]
        config = parse_config(
            {
                "sidecars": {f"s{i}": {"address": s.addresses[0]} for i, s in enumerate(servers)},
                "models": {"m": {"provider": "scripted", "responses": []}},
                "agents": {
                    "a": {
                        "model": "m",
                        "errorProcessorDefaults": False,
                        "outputProcessors": [
                            f"s{i}/{p.id}" for i, processors in enumerate(sidecars) for p in processors
                        ],
                    }
                },
            }
        )
        app = await stack.enter_async_context(App(config))
        spec = dataclasses.replace(app.agent("a").spec, model=ScriptedModel([{"deltas": DELTAS}]))
        yield Agent(spec, app.metrics)


async def streamed(agent: Agent) -> tuple[list[str], str | None]:
    stream = agent.stream("go", CallOptions())
    texts = [c["payload"]["text"] async for c in stream if c["type"] == "text-delta"]
    result = await stream.result()
    return texts, result.error


@pytest.mark.parametrize(
    "sidecars",
    [
        pytest.param(
            [hosted(SpeculativePassing, "p1"), hosted(SpeculativePassing, "p2")], id="speculative-group"
        ),
        pytest.param([hosted(Passing, "p1")], id="plain-stage"),
        pytest.param([hosted(Passing, "p1", "p2")], id="fused-session"),
    ],
)
async def test_a_batch_larger_than_a_sidecar_takes_goes_in_several_requests(
    sidecars: list[list[Processor]],
) -> None:
    assert len("".join(DELTAS)) > 2 * SIDECAR_MAX
    async with lane(*sidecars) as agent:
        texts, error = await streamed(agent)
    assert error is None
    assert texts == DELTAS  # every part, once, in order


@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "plain"])
async def test_a_rewrite_of_large_parts_comes_back_whole(speculative: bool) -> None:
    first = hosted(SpeculativePassing if speculative else Passing, "p1")
    marking = type("mark", (Marking,), {"id": "mark", "speculative": speculative})()
    async with lane(first, [marking]) as agent:
        texts, error = await streamed(agent)
    assert error is None
    assert texts == [d[:4] + "y" * 40_000 for d in DELTAS]


def test_one_part_larger_than_the_bound_goes_alone() -> None:
    def part(n: int) -> Any:
        return convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "z" * n}})

    small, huge = part(10), part(MAX_REQUEST_BYTES + 10)
    pieces = encode_parts([(1, small), (2, huge), (3, small)])
    assert len(pieces) == 3
    assert [len(p) > MAX_REQUEST_BYTES for p in pieces] == [False, True, False]
    assert len(encode_parts([(1, small), (2, small)])) == 1
