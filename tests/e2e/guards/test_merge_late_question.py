"""A question the planner knows is coming is merged however late it comes; one it does not know
of is not waited for (issue 33 item 1, under load), end to end.

A run (streamed or not: the planner reads the lanes of any run live on its replica), a Node
sidecar's processor (`merge_judge.mjs`) asks the model gateway 300 ms after its hook is
called, six times the planner's 50 ms merge window: what a sidecar woken late on a loaded
machine does. Beside it, the built-in moderation guard (another sidecar) asks about the same
text at once. With the Node processor's entry sure to ask (no option that lets it skip a text),
the planner waits for its question and both are answered by one call; with a ``precheck`` option
(it may settle a text without the judge) the planner does not know it will ask, and moderation's
question goes out once its lane is quiet for the window, alone, before the late one arrives.
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


def _agent(judge: str, policy_options: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "echo",
        "errorProcessorDefaults": False,
        "inputProcessors": [
            {"processor": "n/policy", "options": {"model": f"judges/{judge}", **policy_options}},
            {"processor": "a/moderation", "options": {"model": f"judges/{judge}"}},
        ],
    }


AGENTS = {
    "late-known": _agent("known", {"delay_ms": DELAY_MS}),
    # a precheck may settle a text without the judge: the plan cannot know this one will ask
    "late-unknown": _agent("unknown", {"delay_ms": DELAY_MS, "precheck": {"allow": ["^never$"]}}),
    "warm": _agent("warm", {}),
}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    rules = [Rule((POLICY,), {"allowed": True}), Rule((MODERATE,), NO_SCORES)]
    for model in ("known", "unknown", "warm"):
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
    sidecars = {"a": guards_sidecar, "n": node_sidecar}
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
async def test_a_question_known_to_come_is_merged_however_late(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer, streamed: bool
) -> None:
    before = len(judge_server.calls("known"))
    if streamed:
        chunks = await stream(orchestrator, "late-known")
        assert chunks[-1]["type"] == "finish", chunks[-1]
    else:
        result = await generate(orchestrator, "late-known", "What is a processor?")
        assert result["finishReason"] == "stop", result
    # the policy question came 300 ms after moderation's, and still shared its call
    assert _asked(judge_server, "known")[before:] == [["moderation", "policy"]]


async def test_a_question_not_known_to_come_is_not_waited_for(
    orchestrator: OrchestratorProcess, judge_server: JudgeServer
) -> None:
    chunks = await stream(orchestrator, "late-unknown")
    assert chunks[-1]["type"] == "finish", chunks[-1]
    # moderation's went out alone once its lane was quiet, the late one in a call of its own
    assert _asked(judge_server, "unknown") == [["moderation"], ["policy"]]
