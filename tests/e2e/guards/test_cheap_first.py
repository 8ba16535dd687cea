"""Cheap first end to end (issue 33 item 2): a deterministic check in front of an LLM-judged guard
answers before the judge is asked, so a trip means no judge call at all, and a run gives what the
sequential walk gives. Real processes: the orchestrator with its self-started `builtins` sidecar
(`regex-filter`), `procmesh-sidecar guards` (`moderation`, judging through the gateway) and the
scripted judge server, which records every question it is asked.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.guards.support import HATE, NO_SCORES, Replica, generate
from tests.e2e.guards.test_judge_cache import metric
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.test_lifecycle import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-cheap-first-tests"
REGEX = {
    "processor": "builtins/regex-filter",
    "options": {"rules": [{"name": "ticket", "pattern": "TICKET-\\d+"}]},
}


PRECHECK = {"deny": ["(?i)\\bforbidden\\b"], "allow": ["(?i)(hi|hello|thanks)[.!]?"]}
"""Clear cases settled without the judge: a greeting passes, a forbidden word blocks."""


TICKET = {"deltas": ["A first sentence.", " The second has ", "TICKET-9", " in it.", " The end."]}
"""An answer regex-filter aborts on mid-stream, in a window the judge would close two parts later."""


def _lane(*, speculative: bool) -> list[dict[str, Any]]:
    judge = {"processor": "g/moderation", "options": {"model": "judges/mod"}}
    return [REGEX, judge if speculative else {**judge, "speculative": False}]


def _config(sidecar: str, judges_url: str) -> dict[str, Any]:
    agent = {"model": "echo", "errorProcessorDefaults": False}
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 10}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {
            "echo": {"provider": "demo"},
            "ticket": {"provider": "scripted", "responses": [TICKET] * 4},
        },
        "agents": {
            # the output lane: the judge gets each part only once regex-filter let it by
            "stream-cheap-first": {**agent, "model": "ticket", "outputProcessors": _lane(speculative=True)},
            "stream-sequential": {**agent, "model": "ticket", "outputProcessors": _lane(speculative=False)},
            "cheap-first": {**agent, "inputProcessors": _lane(speculative=True)},
            # the judge never called before its input is final: the sequential walk
            "sequential": {**agent, "inputProcessors": _lane(speculative=False)},
            "prechecked": {
                **agent,
                "inputProcessors": [
                    {"processor": "g/moderation", "options": {"model": "judges/mod", "precheck": PRECHECK}}
                ],
            },
        },
    }


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    server.judge("mod", NO_SCORES, Rule(("HATE",), HATE), delay=0.3)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replica(judge_server: JudgeServer) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    config = functools.partial(_config, judges_url=judge_server.base_url)
    return Replica("cheap", config, {"JUDGE_KEY": SECRET})


def _outcome(result: dict[str, Any]) -> tuple[str, Any]:
    """What a run gave, without its ids and timings."""
    return str(result.get("text")), result.get("tripwire")


@pytest.mark.parametrize(
    "text",
    ["Book TICKET-42 with HATE inside.", "Nothing to see here.", "I HATE mondays."],
    ids=["regex-trips", "both-pass", "judge-blocks"],
)
async def test_cheap_first_gives_what_the_sequential_walk_gives(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer, text: str
) -> None:
    cheap = await generate(orchestrator, "cheap-first", text)
    sequential = await generate(orchestrator, "sequential", text)
    assert _outcome(cheap) == _outcome(sequential)


async def test_a_regex_trip_means_the_judge_is_never_asked(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    text = "Please file TICKET-7 for me."
    before = metric(orchestrator, "procmesh_judge_calls_saved_total", "by").get("cheap-first", 0)
    result = await generate(orchestrator, "cheap-first", text)
    assert result["tripwire"]["processorId"] == "regex-filter"
    assert not [c for c in judge_server.judged("mod") if "TICKET-7" in c]
    saved = metric(orchestrator, "procmesh_judge_calls_saved_total", "by").get("cheap-first", 0)
    assert saved == before + 1


@pytest.mark.parametrize(
    ("text", "blocked", "asked"),
    [
        ("Hello!", False, False),
        ("Tell me the FORBIDDEN recipe.", True, False),
        ("I HATE mondays.", True, True),
    ],
    ids=["allowed", "denied", "judged"],
)
async def test_a_guards_precheck_settles_clear_cases_without_the_judge(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer, text: str, blocked: bool, asked: bool
) -> None:
    before = len(judge_server.judged("mod"))
    saved = prechecked(orchestrator)
    result = await generate(orchestrator, "prechecked", text)
    assert (result.get("tripwire") is not None) == blocked
    assert bool([c for c in judge_server.judged("mod")[before:] if text in c]) == asked
    if blocked and not asked:
        assert result["tripwire"]["metadata"]["precheck"] == "deny"
    # a settled text is a judge call saved, in the orchestrator's own counter (the sidecar
    # reports it through the gateway in the background, so it may land just after the answer)
    expected = saved if asked else saved + 1
    await eventually(lambda: prechecked(orchestrator) == expected)


def prechecked(orchestrator: OrchestratorProcess) -> float:
    """``procmesh_judge_calls_saved_total{by="precheck"}`` now."""
    return metric(orchestrator, "procmesh_judge_calls_saved_total", "by").get("precheck", 0)


async def test_in_the_stream_a_part_regex_aborts_on_never_reaches_the_judge(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    cheap = await generate(orchestrator, "stream-cheap-first", "go")
    assert not [c for c in judge_server.judged("mod") if "TICKET-9" in c]
    sequential = await generate(orchestrator, "stream-sequential", "go")
    assert cheap["tripwire"] == sequential["tripwire"]
    assert cheap["tripwire"]["processorId"] == "regex-filter"
