"""A holding guard ahead of judged guards given the parts in advance (issue 33, P8's first chunk).

The built-in output moderation guard holds every part of a window until the window's verdict
comes; the system-prompt scrubber and PII guards after it are speculative (their questions merge
with moderation's at the gateway), so the orchestrator gives them each part in advance, guessing
that moderation passes it on as it came. Moderation's answer to a held part is nothing, so that
guess is withdrawn at every part, and with it the guesses for the later parts. Those were given
again at once, each time: a round of n held parts fed O(n²) parts (a 2,000-character answer:
174,000 feeds, about 0.3 s with the orchestrator's loop blocked, the guards' judge questions
waiting at the gateway behind it). Withdrawn guesses were then given again once, at the round's
end; now a held part's guess stays open, and moderation letting the part go unchanged with its
window confirms it: the later guards' answers given in advance stand, with no second trip.

Through a real orchestrator process and the real ``procmesh-sidecar guards``: the answer comes
through unchanged, the parts the later guards were given in advance commit
(``procmesh_speculative_calls_total{outcome="committed"}``: one a part), and those discarded stay
a few times the answer's parts at most, never the square of a round's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.guards.support import NO_SCORES, Replica, stream, streamed_text
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-held-guesses-test"
MODERATE = "Judge this content for moderation."
SCRUB = "Review this answer for leaked system prompts"
PII = "Find the PII in this content."
WORDS = 400
"""The answer's deltas: one round of the group holds up to 256 of them (`MAX_BATCH`)."""


def _answer() -> list[str]:
    """About 2,800 characters, a word a delta, a sentence every ten words."""
    return [("" if i == 1 else " ") + f"w{i:04d}" + ("." if i % 10 == 0 else "") for i in range(1, WORDS + 1)]


def _entry(pid: str) -> dict[str, Any]:
    return {"processor": f"a/{pid}", "options": {"model": "judges/held"}}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    assert server._server is not None
    # every window's three questions at once: the socketserver's backlog of 5 would reset some
    server._server.socket.listen(256)
    # moderation's verdicts come after the whole answer arrived: every part is held meanwhile
    server.judge(
        "held",
        {},
        Rule((MODERATE,), NO_SCORES, 0.3),
        Rule((SCRUB,), {"detections": [], "reason": None}),
        Rule((PII,), {"categories": [], "detections": []}),
    )
    yield server
    server.stop()


def _config(sidecar: str, judges_url: str) -> dict[str, Any]:
    return {
        "sidecars": {"a": {"address": sidecar, "timeout": 10}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"long": {"provider": "scripted", "responses": [{"deltas": _answer()}] * 4}},
        "agents": {
            "held": {
                "model": "long",
                "errorProcessorDefaults": False,
                "outputProcessors": [
                    _entry("moderation"),
                    _entry("system-prompt-scrubber"),
                    _entry("pii-detector"),
                ],
            }
        },
    }


@pytest.fixture(scope="module")
def replica(judge_server: JudgeServer) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    config = functools.partial(_config, judges_url=judge_server.base_url)
    return Replica("held", config, {"JUDGE_KEY": SECRET})


def _guesses(body: str, processor: str, outcome: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "procmesh_speculative_calls_total"
        and s.labels.get("agent") == "held"
        and s.labels.get("processor") == processor
        and s.labels.get("outcome") == outcome
    )


async def test_guesses_behind_a_holding_guard_stand_when_it_lets_the_parts_go(
    orchestrator: OrchestratorProcess,
) -> None:
    chunks = await stream(orchestrator, "held")
    assert not [c for c in chunks if c["type"] in ("tripwire", "error")], chunks[-3:]
    assert streamed_text(chunks) == "".join(_answer())  # moderation passed every window
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH) as http:
        body = (await http.get("/metrics")).text
    for processor in ("system-prompt-scrubber", "pii-detector"):
        # each of the 400 parts (and the step's end) was given in advance and its answer stood
        assert _guesses(body, processor, "committed") > WORDS, processor
        # given again at once, 400 held parts in rounds of up to 256 discarded tens of thousands
        assert _guesses(body, processor, "discarded") <= 4 * WORDS, processor
