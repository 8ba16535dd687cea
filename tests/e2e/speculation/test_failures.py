"""Failures of speculative and fused processors: each one's own failure policy, the sequential trace.

The recorder sidecar (`tests.e2e.speculation.recorder`) hosts ``flaky`` (speculative; its hooks
raise) next to ``slow`` (speculative) and the recorder, so they are fused; three scripted sidecar
processes serve the stream's other speculative processors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.speculation.test_stream import DELTAS, PROCESSORS
from tests.e2e.speculation.test_unary import RequestLog, _plain, take_log

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RECORDER = "tests.e2e.speculation.recorder"
FAILED_OPEN = "procmesh_processor_failures_let_through_total"


@pytest.fixture(scope="module")
def sidecars(start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path) -> dict[str, SidecarProcess]:
    scenario = sidecar_dir / "stream.json"
    scenario.write_text(json.dumps({"agent": {"outputProcessors": PROCESSORS}}))
    procs = {f"s{i}": start_sidecar("scripted", "--scenario", str(scenario), name=f"f{i}") for i in range(2)}
    procs["rec"] = start_sidecar(name="frec", module=RECORDER)
    return procs


def config(
    sidecars: dict[str, SidecarProcess],
    log: Path,
    *,
    input_processors: list[dict[str, Any]] = (),  # type: ignore[assignment]
    output_processors: list[dict[str, Any]] = (),  # type: ignore[assignment]
    sequential: bool = False,
) -> Any:
    def entry(ref: dict[str, Any]) -> dict[str, Any]:
        return {**ref, "speculative": False} if sequential and ref["processor"] != "rec/recorder" else ref

    recorder = {"processor": "rec/recorder", "options": {"log": str(log)}}
    return parse_config(
        {
            "sidecars": {name: {"address": proc.address} for name, proc in sidecars.items()},
            "models": {"scripted": {"provider": "scripted", "responses": [{"deltas": DELTAS}]}},
            "fuse": not sequential,
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [entry(r) for r in input_processors],
                    "outputProcessors": [*(entry(r) for r in output_processors), recorder],
                }
            },
        },
        "test config",
    )


async def trace(app: App, log: Path) -> dict[str, Any]:
    stream = app.agent("a").stream("hi")
    chunks = [c async for c in stream if c["type"] != "start"]
    result = await stream.result()
    return {
        "chunks": _plain(chunks),
        "text": result.text,
        "error": result.error,
        "violations": result.violations,
        "recorder": take_log(log),
    }


def failed_open(app: App, processor: str, hook: str) -> float:
    return app.metrics.total(FAILED_OPEN, processor=processor, hook=hook)


SLOW = {"processor": "rec/slow", "options": {"log": "/dev/null", "delay": 0}}


@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
async def test_a_fused_members_error_goes_through_its_own_policy(
    ready: dict[str, SidecarProcess], tmp_path: Path, policy: str
) -> None:
    log = tmp_path / "rec.jsonl"
    lane = [SLOW, {"processor": "rec/flaky", "onFailure": policy}, SLOW | {"name": "slow2"}]
    traces = {}
    for sequential in (True, False):
        async with App(config(ready, log, input_processors=lane, sequential=sequential)) as app:
            requests = RequestLog(app, "rec")
            traces[sequential] = await trace(app, log)
            inputs = [members for rpc, members in requests.requests if rpc == "ProcessInput"]
            if not sequential:
                # one request for the three (slow2 is hosted as slow); flaky's error stopped it
                # there, and (failed open) slow2 went again on its own
                again = [["slow"]] if policy == "fail-open" else []
                assert inputs == [["slow", "flaky", "slow"], *again], inputs
            if policy == "fail-open":
                assert failed_open(app, "flaky", "process_input") == 1
                assert failed_open(app, "slow", "process_input") == 0
    assert traces[False] == traces[True]
    if policy == "fail-closed":
        assert "processor 'flaky' failed in process_input" in (traces[True]["error"] or "")
    else:
        assert traces[True]["error"] is None
        assert traces[True]["text"] == "".join(DELTAS)


@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
@pytest.mark.parametrize("layout", ["speculative", "fused"])
async def test_a_failing_stream_member_goes_through_its_own_policy(
    ready: dict[str, SidecarProcess], tmp_path: Path, policy: str, layout: str
) -> None:
    log = tmp_path / "rec.jsonl"
    flaky = {"processor": "rec/flaky", "onFailure": policy, "options": {"word": "apple"}}
    if layout == "speculative":  # three sidecars: one speculative group
        lane = [{"processor": "s0/cnt"}, flaky, {"processor": "s1/rw"}]
    else:  # one session on the recorder's sidecar: flaky#ok, flaky, the recorder (flaky is not the
        # first: a first processor's failure fails the session, for all of them)
        lane = [
            {"processor": "s0/cnt"},
            {"processor": "rec/flaky", "name": "ok", "options": {"word": "zzz"}},
            flaky,
        ]
    traces = {}
    for sequential in (True, False):
        async with App(config(ready, log, output_processors=lane, sequential=sequential)) as app:
            traces[sequential] = await trace(app, log)
            if policy == "fail-open":
                assert failed_open(app, "flaky", "process_output_stream") == 1
                assert failed_open(app, "cnt", "process_output_stream") == 0
    if policy == "fail-open":
        assert traces[False] == traces[True]
        assert traces[True]["error"] is None
        return
    # Fail-closed: the run ends with flaky's error. How many parts before the failing one got out
    # depends on how the parts were batched (a failing stream loses its batch's answers), so
    # only the error and that nothing from the failing part on got out are the same.
    for trace_ in traces.values():
        assert "processor 'flaky' failed in process_output_stream" in (trace_["error"] or "")
        texts = [c["payload"]["text"] for c in trace_["chunks"] if c["type"] == "text-delta"]
        assert texts == DELTAS[: len(texts)]
        assert len(texts) <= DELTAS.index("apple ")


async def test_a_fault_of_the_group_itself_in_a_reader_ends_the_run(
    ready: dict[str, SidecarProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the group's bookkeeping that raises where a member's answers are read (its reader
    task) ends the run with it, as a stage's own bug does: before, the reader task died unseen and
    the run waited forever (every part answered, so no part timeout fired)."""
    advance = SpeculativeGroup.advance

    def faulty(group: SpeculativeGroup) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_coro().__qualname__ == "Member._read":  # type: ignore[union-attr]
            raise RuntimeError("a planted fault in the group")
        advance(group)

    monkeypatch.setattr(SpeculativeGroup, "advance", faulty)
    lane = [{"processor": "s0/cnt"}, {"processor": "s1/rw"}]  # one speculative group
    async with App(config(ready, tmp_path / "rec.jsonl", output_processors=lane)) as app:
        with pytest.raises(RuntimeError, match="a planted fault in the group"):
            await asyncio.wait_for(trace(app, tmp_path / "rec.jsonl"), 30)
