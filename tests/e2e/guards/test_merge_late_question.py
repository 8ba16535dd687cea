"""A question the planner is certain will come is waited for; one it cannot be certain of is
not waited for past the merge window (issue 33 item 1, under load), end to end.

A Node sidecar's processor (`merge_judge.mjs`) asks the model gateway 300 ms after its hook is
called, six times the planner's 50 ms merge window: what a sidecar woken late on a loaded
machine does. Beside it, built-in guards (the ``builtins`` sidecar, declared here) ask about the
same text at once. The planner waits past the window only for a built-in guard whose skip rules
it models (`judge_plan`): a processor of one's own may skip any text (it declares nothing), so
its late question is not waited for, with a ``precheck`` or without; and the language detector
does not ask about a text shorter than its ``min_text_length`` (10), so beside a short message
the other guards' merged call goes once their lane is quiet, without it. Each case would be one
call at 1 s (the planner's cap) if the planner waited: the late question would be in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import start_node_judge
from tests.e2e.guards.judge_server import JudgeServer, Rule, sections
from tests.e2e.guards.support import NO_SCORES, generate, start_judged, stream
from tests.e2e.service.conftest import OrchestratorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-late-question-tests"
POLICY = "Is this request allowed by the house policy?"
MODERATE = "Judge this content for moderation."
DELAY_MS = 300


def _builtin(pid: str, judge: str) -> dict[str, Any]:
    return {"processor": f"builtins/{pid}", "options": {"model": f"judges/{judge}"}}


def _agent(judge: str, policy_options: dict[str, Any]) -> dict[str, Any]:
    policy = {"processor": "n/policy", "options": {"model": f"judges/{judge}", **policy_options}}
    return {
        "model": "echo",
        "errorProcessorDefaults": False,
        "inputProcessors": [policy, _builtin("moderation", judge)],
    }


AGENTS = {
    "late-custom": _agent("custom", {"delay_ms": DELAY_MS}),
    "late-precheck": _agent("precheck", {"delay_ms": DELAY_MS, "precheck": {"allow": ["^never$"]}}),
    "warm": _agent("warm", {}),
    # the language detector skips texts shorter than 10 characters; the policy asks 300 ms late
    # (first: it is not speculative, so the guards after it are called with it)
    "language": {
        "model": "echo",
        "errorProcessorDefaults": False,
        "inputProcessors": [
            {"processor": "n/policy", "options": {"model": "judges/language", "delay_ms": DELAY_MS}},
            *(_builtin(g, "language") for g in ("moderation", "language-detector", "pii-detector")),
        ],
    },
}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    rules = [
        Rule((POLICY,), {"allowed": True}),
        Rule((MODERATE,), NO_SCORES),
        Rule(("Detect the language",), {"iso_code": "en", "confidence": 0.99}),
        Rule(("PII",), {"categories": [], "detections": []}),
    ]
    for model in ("custom", "precheck", "warm", "language"):
        server.judge(model, {}, *rules)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def node_sidecar(sidecar_dir: Path, gateway_port: int) -> Iterator[SidecarProcess]:
    script = Path(__file__).with_name("merge_judge.mjs")
    proc = start_node_judge(sidecar_dir, f"127.0.0.1:{gateway_port}", script, "late-judge")
    yield proc
    proc.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    guards_sidecar: SidecarProcess,
    node_sidecar: SidecarProcess,
    judge_server: JudgeServer,
    gateway_port: int,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    sidecars = {"builtins": guards_sidecar, "n": node_sidecar}  # declared: the built-ins as ours
    started = await start_judged(
        start_orchestrator, gateway_port, sidecars, judge_server.base_url, SECRET, AGENTS
    )
    await generate(started, "warm", "Hello")  # each sidecar's first call opens its gateway channel
    return started


def _asked(server: JudgeServer, model: str) -> list[list[str]]:
    """Each call's guards: its sections' names, or the one guard a call alone was for."""
    out = []
    for call in server.calls(model):
        names = sorted(sections(call.body))
        out.append(names or ["policy" if POLICY in str(call.body["messages"]) else "moderation"])
    return out


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "generate"])
async def test_a_late_question_of_a_processor_of_ones_own_is_not_waited_for(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer, streamed: bool
) -> None:
    before = len(judge_server.calls("custom"))
    if streamed:
        chunks = await stream(orchestrator, "late-custom")
        assert chunks[-1]["type"] == "finish", chunks[-1]
    else:
        result = await generate(orchestrator, "late-custom", "What is a processor?")
        assert result["finishReason"] == "stop", result
    # moderation's went out alone once its lane was quiet, the late one in a call of its own
    assert _asked(judge_server, "custom")[before:] == [["moderation"], ["policy"]]


async def test_a_late_question_behind_a_precheck_is_not_waited_for(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    chunks = await stream(orchestrator, "late-precheck")
    assert chunks[-1]["type"] == "finish", chunks[-1]
    assert _asked(judge_server, "precheck") == [["moderation"], ["policy"]]


@pytest.mark.parametrize(
    ("text", "merged"),
    [
        ("Hello!", ["moderation", "pii-detector"]),  # 6 characters: language does not ask
        ("What should a first-time visitor know?", ["language-detector", "moderation", "pii-detector"]),
    ],
    ids=["short", "long"],
)
async def test_the_merged_call_goes_without_a_question_that_will_not_come(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer, text: str, merged: list[str]
) -> None:
    before = len(judge_server.calls("language"))
    result = await generate(orchestrator, "language", text)
    assert result["finishReason"] == "stop", result
    # the built-ins' call went once the lane was quiet (50 ms), before the policy's came (300 ms):
    # waiting for the language detector's question about a short text would have held it to 1 s,
    # the policy's question in it
    assert _asked(judge_server, "language")[before:] == [merged, ["policy"]]
