"""End to end: the error-retry cap bounds model calls, with processors in a real sidecar process.

Scripted processors (sidecars/scripted.py) are served by ``procmesh-sidecar
scripted``; the model is a fake OpenAI-compatible server that rejects every
request, and counts them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.providers.conftest import OPENAI_KEY_ENV
from tests.integration.providers.fakes import FakeOpenAI, error

pytestmark = pytest.mark.asyncio(loop_scope="module")

REJECTION = error(400, "Invalid request: bad value")  # no default processor recovers from it
RETRIES_WHILE = {"r0": 0, "r1": 1, "r2": 2, "r3": 3, "r5": 5}
"""Processor id -> it asks for a retry while retryCount is below this."""


def _processors() -> list[dict[str, object]]:
    runaway = {"id": "runaway", "processAPIError": [{"do": [{"retry": True}]}]}
    bounded = [
        {"id": pid, "processAPIError": [{"when": {"retryCountLt": k}, "do": [{"retry": True}]}]}
        for pid, k in RETRIES_WHILE.items()
    ]
    return [runaway, *bounded]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(
    openai_api: FakeOpenAI, start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path
) -> AsyncIterator[App]:
    scenario = sidecar_dir / "retry-cap.json"
    scenario.write_text(json.dumps({"agent": {"errorProcessors": _processors()}}))
    proc = start_sidecar("scripted", "--scenario", str(scenario), name="retry-cap")
    await proc.wait_ready()
    runaway = {"model": "local/reject", "errorProcessors": ["scripted/runaway"]}
    config = parse_config(
        {
            "sidecars": {"scripted": {"address": proc.address}},
            "providers": {
                "local": {"kind": "openai", "baseUrl": openai_api.base_url, "apiKeyEnv": OPENAI_KEY_ENV}
            },
            "agents": {
                "runaway-unset": runaway,
                "runaway-0": {**runaway, "maxProcessorRetries": 0},
                "runaway-6": {**runaway, "maxProcessorRetries": 6},
                "mix": {"model": "local/reject", "errorProcessorDefaults": False},
            },
        },
        "test config",
    )
    async with App(config) as app:
        yield app


async def model_calls(
    app: App, openai_api: FakeOpenAI, agent_id: str, options: CallOptions | None = None
) -> int:
    openai_api.reset()
    openai_api.script("reject", REJECTION)
    with pytest.raises(APICallError):
        await app.agent(agent_id).generate("hi", options)
    return len(openai_api.calls("reject"))


@pytest.mark.parametrize(
    ("agent_id", "calls"), [("runaway-unset", 1 + 3), ("runaway-0", 1), ("runaway-6", 7)]
)
async def test_a_runaway_error_processor_is_capped(
    app: App, openai_api: FakeOpenAI, agent_id: str, calls: int
) -> None:
    assert await model_calls(app, openai_api, agent_id) == calls


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.sampled_from(sorted(RETRIES_WHILE)), max_size=4, unique=True),
    cap=st.one_of(st.none(), st.integers(min_value=0, max_value=4)),
)
async def test_model_calls_never_exceed_one_plus_the_cap(
    app: App, openai_api: FakeOpenAI, picks: list[str], cap: int | None
) -> None:
    options = CallOptions(
        error_processors=app.resolve([f"scripted/{p}" for p in picks]), max_processor_retries=cap
    )
    calls = await model_calls(app, openai_api, "mix", options)

    effective_cap = cap if cap is not None else (3 if picks else 0)  # implicit cap 3 with any error processor
    assert calls <= 1 + effective_cap
    wanted = max((RETRIES_WHILE[p] for p in picks), default=0)  # the first that asks for a retry wins
    assert calls == 1 + min(effective_cap, wanted)
