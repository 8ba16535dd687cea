"""prepareStep in the Python API (SEED-GAPS B28): `CallOptions.prepare_step`, a callable called
before each model step, and `CallOptions.prepare_steps`, the same as data.

The agent's model is served by a fake OpenAI API on a real socket (what it received is what is
asserted), and its input lane holds a scripted processor in a real sidecar process whose
processInputStep asks for ``toolChoice: required`` at every step: the callable sees that choice
and its own override wins, because it runs after the lane (as the reference places it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.prepare_step import StepContext, StepOverride, StepRule
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.prepare_step_support import (  # noqa: F401 (fixtures)
    agent_config,
    api_fixture,
    force_tools_sidecar,
    model_fixture,
    systems,
    tools,
)
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(
    api: FakeOpenAI, start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path
) -> AsyncIterator[App]:
    sidecar = await force_tools_sidecar(start_sidecar, sidecar_dir, "prepare-step")
    config = agent_config(sidecar, api)
    async with App(parse_config(config, "test config")) as app:
        yield app


async def test_an_async_callable_changes_the_model_and_tool_choice_of_its_step(
    app: App, model: FakeOpenAI
) -> None:
    seen: list[tuple[int, str, Any, int]] = []

    async def prepare(ctx: StepContext) -> dict[str, Any] | None:
        seen.append((ctx.step_number, ctx.model, ctx.tool_choice, len(ctx.steps)))
        return {"model": "local/small", "tool_choice": "none"} if ctx.step_number == 1 else None

    result = await app.agent("a").generate("weather in Paris?", CallOptions(prepare_step=prepare))

    assert result.text == "from small"
    (first,) = model.calls("big")
    (second,) = model.calls("small")
    assert first.body["tool_choice"] == "required"  # the lane's, untouched at step 0
    assert (second.body["tool_choice"], tools(second)) == ("none", ["weather", "news"])
    # called before each step, after the lane: it sees the lane's choice and the steps done
    assert [(n, choice, done) for n, _, choice, done in seen] == [(0, "required", 0), (1, "required", 1)]
    assert seen[0][1] == seen[1][1] != "local/small"  # the agent's model until it overrides


async def test_a_sync_callable_narrows_the_tools_and_replaces_the_system_for_one_step(
    app: App, model: FakeOpenAI
) -> None:
    def prepare(ctx: StepContext) -> StepOverride | None:
        if ctx.step_number:
            return None
        return StepOverride(
            active_tools=["weather"],
            system="Be brief.",
            provider_options={"openai": {"user": "u-7"}},
            model_settings={"temperature": 0.3},
        )

    result = await app.agent("a").generate("weather in Paris?", CallOptions(prepare_step=prepare))

    assert result.text == "from big"
    first, second = model.calls("big")
    assert (tools(first), systems(first)) == (["weather"], ["Be brief."])
    assert (first.body["user"], first.body["temperature"]) == ("u-7", 0.3)
    # step 1 is the call's own again
    assert (tools(second), systems(second)) == (["weather", "news"], ["Agent instructions."])
    assert not {"user", "temperature"} & set(second.body)


async def test_rules_as_data_apply_from_their_step_and_merge_in_order(app: App, model: FakeOpenAI) -> None:
    rules = (
        StepRule(StepOverride(model="local/small", tool_choice="none"), from_step_number=1),
        StepRule(StepOverride(tool_choice="auto"), step_number=1),
    )
    result = await app.agent("a").generate("weather in Paris?", CallOptions(prepare_steps=rules))

    assert result.text == "from small"
    assert [c.body["tool_choice"] for c in model.calls("big")] == ["required"]
    assert [c.body["tool_choice"] for c in model.calls("small")] == ["auto"]  # the later rule's


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        ({"model": "local/small", "colour": "red", "tools": []}, r"unknown keys \['colour', 'tools'\]"),
        ({"tool_choice": "sometimes"}, r"tool_choice 'sometimes'"),
        ({"model": "nowhere"}, r"prepareStep: unknown model 'nowhere' at step 0"),
        (["model"], r"returned list: give None, a StepOverride or a mapping"),
    ],
)
async def test_what_a_callable_returns_wrong_fails_the_run_naming_it(
    app: App, model: FakeOpenAI, returned: Any, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        await app.agent("a").generate("weather?", CallOptions(prepare_step=lambda ctx: returned))
    assert not model.calls("small")
