"""A stream session whose sidecar stops answering is cut by its time limits, under either policy.

Real sidecar processes: `tests.fixtures.stalling_sidecar` (``mute``: stops answering parts,
stops reading, or never ends its stream, and logs when its call is cancelled), the failure
fixtures' ``counter`` (one session, or two fused) and scripted speculative processors (a group
across two sidecars), those frozen with SIGSTOP for the whole run. Under fail-open the run goes
on without the cut processor: every part it held goes on untouched and in order, the cut is
counted and logged; under fail-closed the stream ends with the error naming it. Either way the
session's call is cancelled, so none stays in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.run import RunResult
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DELTAS = [f"{' ' if i else ''}w{i}" for i in range(12)]
"""The model's answer, part by part."""
BIG = [f"{' ' if i else ''}w{i}{'x' * 256 * 1024}" for i in range(24)]
"""6 MiB in 24 parts: more than gRPC's flow control lets through to a sidecar that stopped
reading, so the orchestrator's writes are still waiting when the session is cut."""
HOOK = "process_output_stream"
LET_THROUGH = "procmesh_processor_failures_let_through_total"
TIMEOUT = 0.5
BOUND = 20.0
"""Seconds a run may take before the test calls it hung (every limit in play is under 2 s)."""

SCRIPTED = [
    {"id": "pass", "speculative": True, "processOutputStream": [{"when": {}, "do": [{"count": "parts"}]}]},
    {
        "id": "rw",
        "speculative": True,
        "processOutputStream": [
            {"when": {"textContains": "w3"}, "do": [{"replaceText": {"pattern": "w3", "with": "W3"}}]}
        ],
    },
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecars(
    start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path
) -> dict[str, SidecarProcess]:
    scenario = sidecar_dir / "cut.json"
    scenario.write_text(json.dumps({"agent": {"outputProcessors": SCRIPTED}}))
    procs = {
        "mute": start_sidecar(name="cut-mute", module="tests.fixtures.stalling_sidecar"),
        "faulty": start_sidecar(name="cut-faulty", module="tests.fixtures.faulty"),
        "a": start_sidecar("scripted", "--scenario", str(scenario), name="cut-a"),
        "b": start_sidecar("scripted", "--scenario", str(scenario), name="cut-b"),
    }
    for proc in procs.values():
        await proc.wait_ready()
    return procs


def config(
    sidecars: dict[str, SidecarProcess],
    lane: list[Any],
    policy: str,
    *,
    delay_ms: float = 20,
    stream_timeout: float | None = None,
    answer: list[str] = DELTAS,
) -> Config:
    limits: dict[str, Any] = {"timeout": TIMEOUT, "onFailure": policy}
    if stream_timeout is not None:
        limits["streamTimeout"] = stream_timeout
    return parse_config(
        {
            "sidecars": {name: {"address": proc.address, **limits} for name, proc in sidecars.items()},
            "models": {"m": {"provider": "scripted", "delayMs": delay_ms, "responses": [{"deltas": answer}]}},
            "agents": {"a": {"model": "m", "errorProcessorDefaults": False, "outputProcessors": lane}},
        },
        "test config",
    )


async def run_once(app: App) -> tuple[list[dict[str, Any]], RunResult]:
    """One streamed run, read to its end; one still open after `BOUND` seconds is a hung one."""

    async def read() -> tuple[list[dict[str, Any]], RunResult]:
        stream = app.agent("a").stream("hi")
        chunks = [c async for c in stream]
        return chunks, await stream.result()

    return await asyncio.wait_for(read(), BOUND)


def deltas(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"]


def let_through(app: App, processor: str) -> float:
    return app.metrics.total(LET_THROUGH, entry=processor, hook=HOOK)  # the entry: its name, else its id


def assert_passed_on(chunks: list[dict[str, Any]], result: RunResult, parts: list[str] = DELTAS) -> None:
    """Every part went on, untouched and in order; the run finished normally."""
    assert result.error is None, result.error
    assert [c for c in chunks if c["type"] == "error"] == []
    assert deltas(chunks) == parts
    assert [c["type"] for c in chunks][-1] == "finish"
    assert result.finish_reason == "stop"


def assert_cut_closed(chunks: list[dict[str, Any]], result: RunResult, processor: str, cause: str) -> None:
    errors = [c for c in chunks if c["type"] == "error"]
    assert len(errors) == 1, [c["type"] for c in chunks]
    message = errors[0]["payload"]["message"]
    assert f"processor '{processor}' failed in {HOOK}" in message, message
    assert cause in message, message
    assert result.finish_reason == "error"


async def mute_events(log: Path, event: str, run_id: str, *, polls: int = 100) -> list[dict[str, Any]]:
    """The fixture's `event` lines for the run, polled for a bounded while (it writes as it goes)."""
    for _ in range(polls):
        lines = await asyncio.to_thread(lambda: log.read_text().splitlines() if log.exists() else [])
        found = [e for e in map(json.loads, lines) if e["event"] == event and e["run"] == run_id]
        if found:
            return found
        await asyncio.sleep(0.05)
    return []


@contextmanager
def frozen(proc: SidecarProcess) -> Iterator[None]:
    """The sidecar process stopped (SIGSTOP) for the block, resumed after it."""
    assert proc.proc is not None
    os.kill(proc.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)


# -- the mute fixture: parts unanswered, a sidecar that stops reading, no stream end -----------


MUTE_CASES: dict[str, tuple[dict[str, Any], list[str], str]] = {
    # answers 3 parts, then none: the 4th part's time limit cuts the session
    "stops-answering": ({"answer": 3}, DELTAS, "timed out after 0.5s"),
    # reads 2 requests, then never again, as a frozen process: the orchestrator's writes wait on
    # flow control when the cut comes (a cut used to end the stage's feeder there: a hang)
    "stops-reading": ({"read": 2}, BIG, "timed out after 0.5s"),
    # answers every part but never sends the stream's end (the state) after the half-close
    "never-ends": ({"end": False}, DELTAS, "no stream end 0.5s after the last part"),
}


@pytest.mark.parametrize("case", list(MUTE_CASES))
@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
async def test_a_session_that_stops_answering_is_cut_and_torn_down(
    sidecars: dict[str, SidecarProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    case: str,
    policy: str,
) -> None:
    options, answer, cause = MUTE_CASES[case]
    log = tmp_path / "mute.jsonl"
    lane = [{"processor": "mute/mute", "options": {**options, "log": str(log)}}]
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.processors.calls")
    async with App(config(sidecars, lane, policy, answer=answer, delay_ms=5)) as app:
        chunks, result = await run_once(app)
        if policy == "fail-open":
            assert_passed_on(chunks, result, answer)
            assert let_through(app, "mute") == 1
            assert f"processor mute failed in {HOOK}, skipped (fail-open): {cause}" in caplog.text
        else:
            assert_cut_closed(chunks, result, "mute", cause)
            assert let_through(app, "mute") == 0
    run_id = chunks[0]["payload"]["runId"]
    assert len(await mute_events(log, "open", run_id)) == 1
    # the orchestrator cancelled the call: the session did not stay open on the sidecar
    assert len(await mute_events(log, "cancelled", run_id)) == 1
    assert await mute_events(log, "end", run_id, polls=1) == []  # cancelled first: no end can follow


async def test_a_session_open_longer_than_stream_timeout_is_cut(
    sidecars: dict[str, SidecarProcess], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``streamTimeout`` bounds the whole session, however promptly each part is answered."""
    log = tmp_path / "mute.jsonl"
    lane = [{"processor": "mute/mute", "options": {"log": str(log)}}]
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.processors.calls")
    # 12 deltas 100 ms apart: the answer takes about 1.2 s, the session may last 0.6 s
    async with App(config(sidecars, lane, "fail-open", delay_ms=100, stream_timeout=0.6)) as app:
        chunks, result = await run_once(app)
        assert_passed_on(chunks, result)
        assert let_through(app, "mute") == 1
    assert "stream session open longer than 0.6s" in caplog.text
    assert len(await mute_events(log, "cancelled", chunks[0]["payload"]["runId"])) == 1
    async with App(config(sidecars, lane, "fail-closed", delay_ms=100, stream_timeout=0.6)) as app:
        chunks, result = await run_once(app)
    assert_cut_closed(chunks, result, "mute", "stream session open longer than 0.6s")


async def test_a_prompt_session_is_not_cut_and_an_entry_sets_its_own_stream_timeout(
    sidecars: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    """The limits cut only a session that stalls or outlives them: the lane entry's
    ``streamTimeout`` (5 s) overrides its sidecar's (0.6 s), so this 1.2 s answer goes through
    under fail-closed, and the session ends with its stream's end."""
    log = tmp_path / "mute.jsonl"
    lane = [{"processor": "mute/mute", "streamTimeout": 5, "options": {"log": str(log)}}]
    async with App(config(sidecars, lane, "fail-closed", delay_ms=100, stream_timeout=0.6)) as app:
        chunks, result = await run_once(app)
    assert_passed_on(chunks, result)
    assert len(await mute_events(log, "end", chunks[0]["payload"]["runId"])) == 1


# -- a frozen sidecar in each layout: one session, a fused session, a speculative group -------


LAYOUTS: dict[str, tuple[list[Any], str, list[str]]] = {
    # lane, the sidecar frozen, the processors it cuts
    "plain": (["faulty/counter"], "faulty", ["counter"]),
    "fused": (
        ["faulty/counter", {"processor": "faulty/counter", "name": "counter2"}],
        "faulty",
        ["counter", "counter2"],
    ),
    "speculative": (["a/rw", "b/pass"], "b", ["pass"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
async def test_a_frozen_sidecar_is_cut_in_every_layout(
    sidecars: dict[str, SidecarProcess], layout: str, policy: str
) -> None:
    lane, frozen_one, cut = LAYOUTS[layout]
    # the speculative group's first member (not frozen) rewrites w3: what it committed goes on
    parts = [p.replace("w3", "W3") if layout == "speculative" else p for p in DELTAS]
    async with App(config(sidecars, lane, policy)) as app:
        with frozen(sidecars[frozen_one]):
            chunks, result = await run_once(app)
        if policy == "fail-open":
            assert_passed_on(chunks, result, parts)
            assert {p: let_through(app, p) for p in cut} == dict.fromkeys(cut, 1)
        else:
            assert_cut_closed(chunks, result, cut[0], "timed out after 0.5s")
