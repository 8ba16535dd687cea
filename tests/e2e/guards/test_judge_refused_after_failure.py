"""A judge question sent after its attempt's model call failed is refused, not asked (issue 33
item 2): the gateway cancels the questions in flight as the call fails (`App.attempt_failed`),
and a question the failed attempt's processor sends in the moments after (a window closed as the
stream broke, a verdict task that woke late) is CANCELLED too (``outcome="attempt_failed"``),
until the run's next attempt begins; the retried attempt's own question is asked.

Real processes: the orchestrator (its self-started builtins sidecar's
`stream-error-retry-processor` retrying the failed call after 1.5 s), a sidecar whose
`late-asker` (`late_asker.py`) asks the gateway about a session's first text delta 400 ms
after it was given it, from a task of its own, and a scripted judge. The answering model's first
call streams a sentence and fails 50 ms later; the second (the retry) streams the same sentence
and ends. So the failed attempt's question comes about 350 ms after the failure, the retry's
1.5 s later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import sidecar_env
from tests.e2e.guards.judge_server import JudgeServer
from tests.e2e.guards.late_asker import QUESTION
from tests.e2e.guards.support import start_judged, stream
from tests.e2e.guards.test_judge_cache import metric
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.test_lifecycle import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-refused-tests"
SENTENCE = "The answer begins."
CUT = {"deltas": [SENTENCE], "error": {"status": 503, "message": "stream cut", "retryable": True}}
RETRIED = {"deltas": [SENTENCE, " And ends."]}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    server.judge("judge", {"flagged": False})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def late_asker(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    proc = SidecarProcess(
        [],
        f"unix://{sidecar_dir / 'late-asker.sock'}",
        env=sidecar_env(f"127.0.0.1:{gateway_port}"),
        log_path=str(sidecar_dir / "late-asker.log"),
        module="tests.e2e.guards.late_asker",
    )
    proc.start()
    yield proc
    proc.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    late_asker: SidecarProcess,
    judge_server: JudgeServer,
    gateway_port: int,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    retry = {"processor": "builtins/stream-error-retry-processor", "options": {"delay_ms": 1500}}
    agent = {
        "model": "answer",
        "errorProcessorDefaults": False,
        "errorProcessors": [retry],
        "outputProcessors": [{"processor": "l/late-asker", "options": {"model": "judges/judge"}}],
    }
    models = {"answer": {"provider": "scripted", "delayMs": 50, "responses": [CUT, RETRIED]}}
    return await start_judged(
        start_orchestrator,
        gateway_port,
        {"l": late_asker},
        judge_server.base_url,
        SECRET,
        {"retried": agent},
        models,
    )


async def test_a_question_sent_after_its_attempt_failed_is_refused_and_the_retrys_is_asked(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    chunks = await stream(orchestrator, "retried")
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert text.endswith("And ends."), chunks
    # the retried attempt's question comes 400 ms after its first delta: wait for its answer to be
    # counted (a condition, not a fixed sleep: under load 0.6 s was not always enough)
    await eventually(lambda: metric(orchestrator, "procmesh_gateway_calls_total", "outcome").get("ok"))
    outcomes = metric(orchestrator, "procmesh_gateway_calls_total", "outcome")
    assert outcomes.get("attempt_failed", 0) == 1, outcomes  # the failed attempt's, refused
    assert outcomes.get("ok", 0) == 1, outcomes  # the retry's, answered
    asked = [c for c in judge_server.calls("judge") if QUESTION in str(c.body["messages"])]
    assert len(asked) == 1  # the judge never heard the failed attempt's
    assert metric(orchestrator, "procmesh_judge_calls_saved_total", "by").get("cancelled", 0) == 1
