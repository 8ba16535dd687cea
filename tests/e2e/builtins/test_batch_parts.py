"""batch-parts through a real `procmesh-sidecar batch-parts` process and the agent loop."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import make_config, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "batch-parts")


async def test_deltas_are_combined_in_batches(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("batch-parts", batch_size=3)],
        responses=[{"deltas": ["a", "b", "c", "d", "e", "f"]}],
    )
    out = await run(cfg, stream=True)
    assert out.text_deltas() == ["abc", "def"]
    assert out.result.text == "abcdef"


async def test_tool_calls_are_never_held_back(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("batch-parts", batch_size=2)],
        responses=[
            {"deltas": ["x", "y"], "toolCalls": [{"name": "lookup", "args": {}}]},
            {"deltas": ["1", "2", "3", "4"]},
        ],
        tools={"lookup": {"result": "r"}},
    )
    out = await run(cfg, stream=True)
    assert out.result.steps[0]["toolResults"][0]["result"] == "r"  # the tool call ran
    assert out.text_deltas() == ["xy", "12", "34"]


async def test_max_wait_time_flushes_with_the_next_part(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("batch-parts", batch_size=100, max_wait_time=20)],
        responses=[{"deltas": ["a", "b", "c", "d"]}],
        delay_ms=80,
    )
    out = await run(cfg, stream=True)
    assert out.text_deltas() == ["ab", "cd"]  # each delta came 80 ms after the previous one


async def test_a_partial_last_batch_is_flushed_at_the_step_end(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("batch-parts", batch_size=3)],
        responses=[{"deltas": ["a", "b", "c", "d"]}],
    )
    out = await run(cfg, stream=True)
    assert out.text_deltas() == ["abc", "d"]  # step-finish passes the hook: the rest goes out first
    assert out.result.text == "abcd"


async def test_the_batch_goes_out_before_a_tool_call(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("batch-parts", batch_size=5)],
        responses=[
            {"deltas": ["x", "y"], "toolCalls": [{"name": "lookup", "args": {}}]},
            {"deltas": ["1"]},
        ],
        tools={"lookup": {"result": "r"}},
    )
    out = await run(cfg, stream=True)
    kinds = [c["type"] for c in out.chunks if c["type"] in ("text-delta", "tool-call")]
    assert kinds == ["text-delta", "tool-call", "text-delta"]
    assert out.text_deltas() == ["xy", "1"]
