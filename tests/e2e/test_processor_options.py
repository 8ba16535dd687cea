"""Options given to a processor that takes none are refused at start-up, through a real sidecar.

A Python processor with no ``Options`` model and no hook taking ``options`` (or ``**kwargs``)
reads no option: the SDK's ``Describe`` publishes a schema taking none (`NO_OPTIONS_SCHEMA`), so a
config that gives it options (a typo'd entry, options meant for another processor) fails to start
naming them. Before, the schema was empty ("any options") and the run went on without them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import call, make_config, ref, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "examples")


@pytest.mark.parametrize(
    ("lane", "processor"), [("input_processors", "pii-redactor"), ("output_processors", "word-counter")]
)
async def test_options_for_a_processor_that_takes_none_fail_the_start_naming_them(
    address: str, lane: str, processor: str
) -> None:
    config = make_config(address, **{lane: [ref(processor, threshold=0.5)]})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=processor) as info:
        async with App(config):
            pass
    where = "inputProcessors" if lane == "input_processors" else "outputProcessors"
    assert f"agents.a.{where}.0.options: Additional properties are not allowed" in str(info.value)
    assert "'threshold' was unexpected" in str(info.value)


async def test_the_same_processors_without_options_run(address: str) -> None:
    config = make_config(
        address,
        input_processors=[ref("pii-redactor")],
        output_processors=[ref("word-counter")],
        responses=[{"text": "two words"}],
    )
    async with App(config) as app:
        result = await call(app, "mail me at ada@example.com")
    assert result.result.text == "two words"
    assert "[email]" in str(result.requests[0].prompt)
