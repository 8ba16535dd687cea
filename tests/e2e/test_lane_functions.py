"""App's ``lanes=``: an agent's lane as a function of the request context (the seeds'
``inputProcessors: ({ requestContext }) => [...]``), against a real sidecar. The function returns
entries as the config writes them, bound as each run starts; what it gets wrong, and a function
beside the config's own lane, are errors naming the entry or the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.test_lane_conditions import MAIL, make, redacted

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def examples(start_sidecar: Callable[..., SidecarProcess]) -> str:
    proc = start_sidecar("examples", name="fn-examples")
    await proc.wait_ready()
    return proc.address


def by_tier(request_context: Mapping[str, Any]) -> Sequence[Any]:
    """gold: the redactor; silver: the redactor as a mapping, behind a condition; else nothing."""
    tier = request_context.get("tier")
    if tier == "gold":
        return ["ex/pii-redactor"]
    if tier == "silver":
        return [{"processor": "ex/pii-redactor", "when": {"key": "pii", "present": True}}]
    return []


async def test_each_run_binds_the_lane_its_context_chooses(examples: str) -> None:
    async with App(make(examples), lanes={"a": {"input": by_tier}}) as app:
        assert await redacted(app, {"tier": "gold"})
        assert not await redacted(app, {"tier": "free"})
        assert await redacted(app, {"tier": "silver", "pii": 1})
        assert not await redacted(app, {"tier": "silver"})


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ("ex/nope", r"agents\.a\.inputProcessors\.0: sidecar 'ex' does not host processor 'nope'"),
        ({"processor": "ex/pii-redactor", "colour": 1}, r"agents\.a\.inputProcessors\.0: .*colour"),
    ],
)
async def test_an_entry_it_gets_wrong_fails_the_run_naming_it(examples: str, entry: Any, error: str) -> None:
    async with App(make(examples), lanes={"a": {"input": lambda rc: [entry]}}) as app:
        with pytest.raises(ConfigError, match=error):
            await app.agent("a").generate(MAIL)


@pytest.mark.parametrize(
    ("agent", "lanes", "error"),
    [
        (
            {"inputProcessors": ["ex/pii-redactor"]},
            {"a": {"input": by_tier}},
            r"agents\.a\.inputProcessors: ",
        ),
        ({}, {"b": {"input": by_tier}}, r"App lanes= names agents the config does not have: \['b'\]"),
        ({}, {"a": {"error": by_tier}}, r"unknown lanes \['error'\] \(input, output\)"),
    ],
)
async def test_what_it_cannot_take_is_a_start_up_error(
    examples: str, agent: dict[str, Any], lanes: Any, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        async with App(make(examples, **agent), lanes=lanes):
            pass
