"""A run that ends cancels the judge questions its guards still have in flight (issue 33 item 2).

Real processes: the orchestrator with its self-started `builtins` sidecar (`regex-filter`),
`procmesh-sidecar guards` (`moderation`, judging through the gateway) and a scripted judge that
answers after a long pause. The answer's first sentence is judged while the stream goes on; a
later part trips regex-filter, and the run ends with the judge's question unanswered: the gateway
cancels it (``procmesh_judge_calls_saved_total{by="cancelled"}``, outcome ``run_ended``), the judge
sees its connection closed, nothing is cached, and the run does not wait for the judge.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.guards.judge_server import JudgeServer
from tests.e2e.guards.support import NO_SCORES, Replica, stream
from tests.e2e.guards.test_cheap_first import REGEX
from tests.e2e.guards.test_judge_cache import metric
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import Reply

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-cancel-tests"


class HoldingJudge(JudgeServer):
    """A judge that sends its answer's head and then nothing until its caller hangs up (the fake's
    ``holdAfter``): its `released` event is set when the gateway closed the connection."""

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        return {**super().respond(path, headers, body), "holdAfter": 0}


TICKET = {"deltas": ["A first sentence is judged. ", "A second one. ", "Then TICKET-9", " and the end."]}
"""An answer whose first sentence is asked about before regex-filter aborts on a later part."""


def _config(sidecar: str, judges_url: str) -> dict[str, Any]:
    lane = [REGEX, {"processor": "g/moderation", "options": {"model": "judges/slow"}}]
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 60}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"ticket": {"provider": "scripted", "delayMs": 300, "responses": [TICKET] * 4}},
        "judgeCache": {"enabled": True},
        "agents": {"tripped": {"model": "ticket", "errorProcessorDefaults": False, "outputProcessors": lane}},
    }


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = HoldingJudge(api_key=SECRET)
    server.start()
    server.judge("slow", NO_SCORES)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replica(judge_server: JudgeServer) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    config = functools.partial(_config, judges_url=judge_server.base_url)
    return Replica("cancel", config, {"JUDGE_KEY": SECRET})


def _asked(judge_server: JudgeServer) -> int:
    return len([c for c in judge_server.judged("slow") if "A first sentence" in c])


async def test_a_trip_cancels_the_judge_question_in_flight_and_caches_nothing(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    saved = lambda: metric(orchestrator, "procmesh_judge_calls_saved_total", "by")  # noqa: E731
    before = saved().get("cancelled", 0)
    chunks = await stream(orchestrator, "tripped")
    tripwire = [c for c in chunks if c["type"] == "tripwire"]
    assert [t["payload"]["processorId"] for t in tripwire] == ["regex-filter"], chunks
    assert await asyncio.to_thread(judge_server.released.wait, 10)  # the judge saw the hang-up
    asked = _asked(judge_server)
    assert asked == 1  # the first sentence's question reached the judge, paced 300 ms a part
    cancelled = saved().get("cancelled", 0) - before
    assert cancelled >= 1  # the first sentence's, and the second's if it was asked
    ended = metric(orchestrator, "procmesh_gateway_calls_total", "outcome")
    assert ended.get("run_ended", 0) >= 1
    # the cancelled question left no verdict behind: the next run asks the judge again
    await stream(orchestrator, "tripped")
    assert _asked(judge_server) == 2
    assert saved().get("cache", 0) == 0
    assert saved().get("cancelled", 0) - before > cancelled  # cancelled again: it was never cached
