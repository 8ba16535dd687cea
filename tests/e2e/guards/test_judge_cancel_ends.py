"""Every run's end cancels its guards' judge questions in flight, however the run started (issue 33
item 2): a generate without a ``runId`` has only the id it made itself, and its end reaches the
model gateway too (`App.run_ended`); a verdict asked alone (``merge_judge: false``) is cancelled as
a section is; a step retry leaves nothing of the rejected attempt in flight to cancel.

Real processes: the orchestrator (with its self-started builtins sidecar), `procmesh-sidecar
guards` (`moderation`, judging through the gateway), `procmesh-sidecar examples` (`length-check`)
and a scripted judge whose ``held`` model holds its answer until its caller hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import GATEWAY_KEY, sidecar_env
from tests.e2e.guards.judge_server import JudgeServer
from tests.e2e.guards.support import NO_SCORES, generate, stream
from tests.e2e.guards.test_judge_cache import metric
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import Reply
from tests.integration.service.support import API_KEYS, AUTH, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-run-end-tests"


REGEX = {
    "processor": "builtins/regex-filter",
    "options": {"rules": [{"name": "t", "pattern": "TICKET-\\d+"}]},
}
TICKET = {"deltas": ["A first sentence is judged. ", "A second one. ", "Then TICKET-9", " and the end."]}
"""An answer whose first sentence is asked about before regex-filter aborts on a later part."""
LONG = "One two three four five six seven eight nine ten."
"""Over length-check's 5 words: its processOutputStep asks for a retry."""


class _Holding(JudgeServer):
    """The ``held`` judge sends its answer's head, then nothing until the caller hangs up
    (`released` is set then); the ``quick`` one answers at once."""

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        reply = super().respond(path, headers, body)
        return {**reply, "holdAfter": 0} if body.get("model") == "held" else reply


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = _Holding(api_key=SECRET)
    server.start()
    server.judge("held", NO_SCORES)
    server.judge("quick", NO_SCORES)
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    sidecar_dir: Path, judge_server: JudgeServer, start_orchestrator: Callable[..., OrchestratorProcess]
) -> AsyncIterator[OrchestratorProcess]:
    port = free_port()  # the gateway's: the sidecar is told it before the orchestrator starts
    sidecar = SidecarProcess(
        ["guards"],
        f"unix://{sidecar_dir / 'run-ends.sock'}",
        env=sidecar_env(f"127.0.0.1:{port}"),
        log_path=str(sidecar_dir / "run-ends.log"),
    )
    examples = SidecarProcess(["examples"], f"unix://{sidecar_dir / 'run-ends-examples.sock'}")
    for process in (sidecar, examples):
        process.start()
        await process.wait_ready()
    lane = [{"processor": "g/moderation", "options": {"model": "judges/held"}}]
    alone = [REGEX, {"processor": "g/moderation", "options": {"model": "judges/held", "merge_judge": False}}]
    retried = [
        {"processor": "g/moderation", "options": {"model": "judges/quick"}},
        {"processor": "e/length-check", "options": {"max_words": 5}},
    ]
    judges = {"kind": "openai", "baseUrl": judge_server.base_url, "apiKeyEnv": "JUDGE_KEY"}
    config = {
        "sidecars": {"g": {"address": sidecar.address, "timeout": 60}, "e": {"address": examples.address}},
        "providers": {"judges": judges},
        "models": {
            "answer": {"provider": "scripted", "responses": [{"text": "An answer to judge."}] * 4},
            "ticket": {"provider": "scripted", "delayMs": 300, "responses": [TICKET] * 4},
            "wordy": {"provider": "scripted", "responses": [{"text": LONG}, {"text": "Short answer."}] * 2},
        },
        "agents": {
            "judged": {"model": "answer", "errorProcessorDefaults": False, "outputProcessors": lane},
            "alone": {"model": "ticket", "errorProcessorDefaults": False, "outputProcessors": alone},
            "retried": {
                "model": "wordy",
                "errorProcessorDefaults": False,
                "maxProcessorRetries": 1,
                "outputProcessors": retried,
            },
        },
    }
    env = {"PROCMESH_API_KEYS": f"{API_KEYS},{GATEWAY_KEY}=@gateway", "JUDGE_KEY": SECRET}
    yield await asyncio.to_thread(start_orchestrator, config, "--grpc-port", str(port), env=env)
    for process in (sidecar, examples):
        process.stop(grace=2.0)


async def test_a_generate_without_a_run_id_cancels_its_judge_question_when_it_ends(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    # The caller chose no runId, and the run ends because its client left while the guard
    # waited for its verdict (abort_on_disconnect): the judge's connection is closed all the same,
    # by the guard's hook being cancelled (its sidecar hangs up) or by the run's end at the
    # gateway, whichever comes first (the unit tests pin that every run's end is told).
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=60) as http:
        call = asyncio.create_task(http.post("/api/agents/judged/generate", json={"messages": "go"}))
        assert await asyncio.to_thread(judge_server.held.wait, 10)  # the judge holds the question
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    assert await asyncio.to_thread(judge_server.released.wait, 10)  # the judge saw the hang-up
    assert len(judge_server.judged("held")) == 1


async def test_a_verdict_asked_alone_is_cancelled_at_its_runs_end_too(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    # merge_judge: false sends no section; the stream's first window is asked about, then
    # regex-filter trips and ends the run while nothing awaits that question but the run's end
    judge_server.held.clear()
    judge_server.released.clear()
    saved = lambda: metric(orchestrator, "procmesh_judge_calls_saved_total", "by")  # noqa: E731
    ended = lambda: metric(orchestrator, "procmesh_gateway_calls_total", "outcome")  # noqa: E731
    before, gone = saved().get("cancelled", 0), ended().get("run_ended", 0)
    chunks = await stream(orchestrator, "alone")
    assert [c["payload"]["processorId"] for c in chunks if c["type"] == "tripwire"] == ["regex-filter"]
    assert await asyncio.to_thread(judge_server.released.wait, 10)  # the judge saw the hang-up
    assert saved().get("cancelled", 0) - before >= 1
    assert ended().get("run_ended", 0) - gone >= 1


async def test_a_step_retry_leaves_no_judge_question_of_the_rejected_attempt_in_flight(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    # What "a trip that ends one stream while the run retries" is in procmesh: a stream abort
    # (retry or not) ends the run, and a retry comes from processOutputStep, after the step's
    # stream, whose guards wait for every verdict at the step's end. So the rejected attempt's
    # question is answered, not cancelled, before the step runs again (operations.md says so).
    saved = lambda: metric(orchestrator, "procmesh_judge_calls_saved_total", "by")  # noqa: E731
    ended = lambda: metric(orchestrator, "procmesh_gateway_calls_total", "outcome")  # noqa: E731
    before, gone, answered = saved().get("cancelled", 0), ended().get("run_ended", 0), ended().get("ok", 0)
    result = await generate(orchestrator, "retried", "go")
    assert result.get("tripwire") is None, result
    assert result["text"] == "Short answer."
    tripped = [(step.get("tripwire") or {}).get("processorId") for step in result["steps"]]
    assert tripped == ["length-check", None]  # the first attempt rejected, the second kept
    assert [LONG in c for c in judge_server.judged("quick")] == [True, False]  # each attempt judged
    assert ended().get("ok", 0) - answered == 2  # both verdicts were given
    assert saved().get("cancelled", 0) == before
    assert ended().get("run_ended", 0) == gone
