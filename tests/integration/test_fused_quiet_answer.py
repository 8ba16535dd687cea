"""A fused session whose processors all pass a part on answers with the effects the orchestrator
commits at once (`procmesh.hooks.quiet_effects`, issue 32 P7): one empty outcome per further
processor, nothing else. Should the SDK's encoding of such an answer drift from what the
orchestrator compares with, the orchestrator would still be right (anything else goes the long
way, `fused_items`) but every fused pass-through part would cost it the long way: so the real
sidecar's answers are run through the orchestrator's own stream, and the parts that went the long
way are counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from procmesh import Processor, ProcessorServer, convert
from procmesh.hooks import quiet_effects
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.processors import speculative_member, stream_stage

TEXT = "one two three four five six"


class Passing(Processor):
    """Hands every part on unchanged, as each of a fused pass-through lane's processors does."""

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return part


class SpeculativePassing(Passing):
    speculative = True


class Reporting(Passing):
    """Reports each part: an answer with effects, which must go the long way."""

    async def process_output_stream(
        self, part: dict[str, Any], report_violation: Callable[..., None]
    ) -> dict[str, Any]:
        report_violation("seen", None)
        return part


def processors(kind: type[Passing], *ids: str) -> list[Processor]:
    return [type(pid, (kind,), {"id": pid})() for pid in ids]


async def test_a_fused_pass_through_answer_carries_exactly_the_quiet_effects() -> None:
    async with serve_for_test(processors(Passing, "x", "y", "z")) as client:
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


@dataclass
class Paths:
    """What the orchestrator's sessions did with the sidecars' answers."""

    fused: list[int] = field(default_factory=list)
    """The size of each fused session the orchestrator opened (its `quiet_effects`)."""
    long_way: int = 0
    """Fused answers that went the long way (`fused_items`)."""


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Paths:
    """Spies on both kinds of session (`stream_stage`, `speculative_member`): the real code still runs."""
    seen = Paths()
    for module in (stream_stage, speculative_member):

        def counted(*args: Any, real: Any = module.fused_items) -> Any:
            seen.long_way += 1
            return real(*args)

        def quiet(processors: int, real: Any = module.quiet_effects) -> Any:
            if processors > 1:
                seen.fused.append(processors)
            return real(processors)

        monkeypatch.setattr(module, "fused_items", counted)
        monkeypatch.setattr(module, "quiet_effects", quiet)
    return seen


@contextlib.asynccontextmanager
async def lane(*sidecars: list[Processor]) -> AsyncIterator[App]:
    """An app whose output lane is every processor of `sidecars`, each sidecar's fused."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(ProcessorServer(hosted, ["127.0.0.1:0"])) for hosted in sidecars
        ]
        config = parse_config(
            {
                # fail-open: a processor that is not speculative joins a fused session only
                # behind ones that fail open (`stream_plan.may_follow`)
                "sidecars": {
                    f"s{i}": {"address": s.addresses[0], "onFailure": "fail-open"}
                    for i, s in enumerate(servers)
                },
                "models": {"m": {"provider": "scripted", "responses": [{"text": TEXT}]}},
                "agents": {
                    "a": {
                        "model": "m",
                        "errorProcessorDefaults": False,
                        "outputProcessors": [
                            f"s{i}/{p.id}" for i, hosted in enumerate(sidecars) for p in hosted
                        ],
                    }
                },
            }
        )
        yield await stack.enter_async_context(App(config))


@pytest.mark.parametrize(
    "sidecars",
    [
        pytest.param([processors(Passing, "x", "y", "z")], id="one-fused-session"),
        pytest.param(
            [processors(SpeculativePassing, "x", "y"), processors(SpeculativePassing, "v", "w")],
            id="speculative-group-of-fused-sessions",
        ),
    ],
)
async def test_the_orchestrator_commits_a_fused_pass_through_at_once(
    sidecars: list[list[Processor]], paths: Paths
) -> None:
    async with lane(*sidecars) as app:
        result = await app.agent("a").generate("hi")
    assert result.text == TEXT
    assert paths.fused == [len(hosted) for hosted in sidecars]
    assert paths.long_way == 0


async def test_a_fused_answer_with_effects_goes_the_long_way(paths: Paths) -> None:
    """The spies see the long way: an answer that is not quiet takes it."""
    async with lane(processors(Passing, "x", "y") + processors(Reporting, "z")) as app:
        result = await app.agent("a").generate("hi")
    assert result.text == TEXT
    assert paths.fused == [3]
    assert paths.long_way > 0
