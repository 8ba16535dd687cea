"""A model call that fails mid-stream and is retried gives up its attempt's judge questions: the
guards judged that attempt's text through the gateway, and the questions still in flight when the
call failed are cancelled then (the judge sees the hang-up), not left to run to their end, while
the retried attempt is judged as ever (`App.attempt_failed`, issue 33 item 2).

Real processes: the orchestrator (with its self-started builtins sidecar, whose
`stream-error-retry-processor` retries the failed call), `procmesh-sidecar guards` (`moderation`,
judging each window through the gateway) and a scripted judge (an OpenAI-compatible server) that
holds its first verdict on the failed attempt's first sentence until its caller hangs up and
answers every other question at once. The answering model is the scripted one: its first call
streams a sentence and more, then fails (retryable); the second starts with the same sentence, as a
retried call often does: the guard asks about it again rather than taking the withdrawn question's
CANCELLED for its verdict.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.guards.judge_server import JudgeServer
from tests.e2e.guards.support import NO_SCORES, Replica, stream
from tests.e2e.guards.test_judge_cache import metric
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import Reply

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-attempt-tests"
FAILED = ["The failed attempt.", " It goes on", " until the cut."]
"""The first call's deltas (300 ms apart): the first sentence's window is asked about before
the call fails."""
KEPT = "The rest of the retried answer."
CUT = {"deltas": FAILED, "error": {"status": 503, "message": "stream cut", "retryable": True}}
RETRIED = {"deltas": [FAILED[0], " " + KEPT]}


class _HoldingFirst(JudgeServer):
    """The judge holds its first verdict (its head sent, then nothing until the caller hangs up:
    `released` is set then); every later question is answered at once, and `released_before` says
    whether that hang-up had come when it was asked."""

    def __init__(self, api_key: str) -> None:
        super().__init__(api_key)
        self.released_before: list[bool] = []

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        reply = super().respond(path, headers, body)
        if body.get("model") != "judge":
            return reply
        if not self.held.is_set():
            return {**reply, "holdAfter": 0}
        self.released_before.append(self.released.is_set())
        return reply


@pytest.fixture(scope="module")
def judge_server() -> Iterator[_HoldingFirst]:
    server = _HoldingFirst(api_key=SECRET)
    server.start()
    server.judge("judge", NO_SCORES)
    yield server
    server.stop()


def _config(sidecar: str, judges_url: str) -> dict[str, Any]:
    guard = {"processor": "g/moderation", "options": {"model": "judges/judge"}}
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 60}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"answer": {"provider": "scripted", "delayMs": 300, "responses": [CUT, RETRIED]}},
        "agents": {"retried": {"model": "answer", "outputProcessors": [guard]}},
    }


@pytest.fixture(scope="module")
def replica(judge_server: JudgeServer) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    return Replica(
        "attempt", functools.partial(_config, judges_url=judge_server.base_url), {"JUDGE_KEY": SECRET}
    )


async def test_a_call_failing_mid_stream_cancels_its_attempts_judge_questions_and_the_retry_is_judged(
    orchestrator: OrchestratorProcess, judge_server: _HoldingFirst
) -> None:
    chunks = await stream(orchestrator, "retried")  # a stream: the model's deltas come apart
    assert [c["type"] for c in chunks if c["type"] in ("tripwire", "error")] == []
    # the failed attempt's sentence was held for its verdict, which never came; the retried
    # attempt's verdicts let its answer through
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert text == f"{FAILED[0]} {KEPT}"
    assert await asyncio.to_thread(judge_server.released.wait, 10)  # the judge saw the hang-up
    assert judge_server.released_before == [True, True]  # as the call failed, before the retry
    judged = judge_server.judged("judge")
    # the held question first; the retried answer's two windows are asked together, in either
    # order (on a loaded machine the second window's question may reach the judge first)
    assert len(judged) == 3
    assert FAILED[0] in judged[0]
    retried = sorted(judged[1:], key=lambda t: KEPT in t)
    assert [FAILED[0] in t for t in retried] == [True, False]  # the sentence asked again
    assert [KEPT in t for t in retried] == [False, True]
    outcomes = metric(orchestrator, "procmesh_gateway_calls_total", "outcome")
    assert outcomes.get("attempt_failed", 0) == 1  # the failed attempt's question, cancelled
    assert outcomes.get("run_ended", 0) == 0  # not at the run's end
    assert outcomes.get("ok", 0) == 2  # the retried attempt's verdicts, given
    assert metric(orchestrator, "procmesh_judge_calls_saved_total", "by").get("cancelled", 0) == 1
