"""Each window's parts go as its verdict comes, not after the last window's (issue 33, P8's first chunk).

A guard holds a window's parts until its verdict. When the whole answer has arrived (the step's
end is being processed), it waits for every window; it used to let them all go together, after
the last window's verdict. Now it lets each go as its verdict comes, in a partial result of the
step's last part (``StreamPartResult.more``), and the orchestrator hands those on at once: to
the caller, to the next guard of a sequential lane or of a speculative group (before its guesses
are confirmed, when the parts are ones it held), and out of a rehearsed first step once adopted.

Through a real orchestrator process and the real ``procmesh-sidecar guards``, with a judge whose
answer about the last window waits until the test opens its gate: the test opens it only once
the caller has the first window's text, so the first window's text comes before the last
window's verdict (or the judge's fallback opens the gate and the order says the test failed).
Stream and violations are the fused twin's (guards that do not merge their questions share one
fused session, which takes no partial results: the old path), whose first text comes only after
the last verdict.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.guards.support import CONTACT, EMAIL, NO_SCORES, Replica, stream, violations_of
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import Reply

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-window-release-test"
MODERATE = "Judge this content for moderation."
SCRUB = "Review this answer for leaked system prompts"
PII = "Find the PII in this content."
FALLBACK = 20.0
"""Seconds a gated verdict waits at most (a test whose gate the caller's text never opens fails)."""
PLAIN = [
    "Alpha",
    " one",
    " is",
    " fine.",
    " Bravo",
    " two",
    " is",
    " fine.",
    " Charlie",
    " three",
    " is",
    " fine.",
]
MAILED = [
    "Alpha",
    " one",
    " is",
    " fine.",
    " Bravo",
    " mail",
    f" {EMAIL}",
    " now.",
    " Charlie",
    " is",
    " fine.",
]
"""Three windows (one a sentence); the second holds an address the PII guard redacts."""
OUTPUT = ("moderation", "system-prompt-scrubber", "pii-detector")


class GatedJudge(JudgeServer):
    """The judge server, a question whose content holds a gate's marker answered once the gate is open."""

    def __init__(self, api_key: str) -> None:
        super().__init__(api_key)
        self.gates: dict[str, threading.Event] = {}
        self.verdicts: list[str] = []
        """The gated markers whose verdicts were sent, in order."""
        self._gate_lock = threading.Lock()
        self._chained = ("", "")

    def close(self, *markers: str, first: str = "", once: str = "") -> None:
        """Gates for `markers`; `first`'s opens as soon as a question about `once` arrives."""
        with self._gate_lock:
            self.gates = {m: threading.Event() for m in markers}
            self.verdicts = []
            self._chained = (once, first)

    def open(self, marker: str) -> None:
        self.gates[marker].set()

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        content = "\n".join(str(m.get("content")) for m in users)
        once, first = self._chained
        if once and once in content:
            self.open(first)
        gated = [m for m in self.gates if m in content]
        for marker in gated:
            self.gates[marker].wait(FALLBACK)
        reply = super().respond(path, headers, body)
        with self._gate_lock:
            self.verdicts += gated
        return reply


@pytest.fixture(scope="module")
def judge_server() -> Iterator[GatedJudge]:
    server = GatedJudge(api_key=SECRET)
    server.start()
    assert server._server is not None
    server._server.socket.listen(256)
    server.judge(
        "gated",
        {},
        Rule((MODERATE,), NO_SCORES),
        Rule((SCRUB,), {"detections": [], "reason": None}),
        Rule((PII, EMAIL), CONTACT),
        Rule((PII,), {"categories": [], "detections": []}),
    )
    yield server
    server.stop()


def _guard(pid: str, **options: Any) -> dict[str, Any]:
    return {"processor": f"r/{pid}", "options": {"model": "judges/gated", **options}}


def _agent(model: str, lane: list[str], **more: Any) -> dict[str, Any]:
    return {
        "model": model,
        "errorProcessorDefaults": False,
        "outputProcessors": [_guard(p) for p in lane],
        **more,
    }


def _config(sidecar: str, judges_url: str) -> dict[str, Any]:
    scripted = {"plain": PLAIN, "mailed": MAILED}
    models = {k: {"provider": "scripted", "responses": [{"deltas": v}] * 16} for k, v in scripted.items()}
    pii_first = ["pii-detector", "moderation", "system-prompt-scrubber"]
    fused = {"outputProcessors": [_guard(p, merge_judge=False) for p in OUTPUT]}
    agents = {
        "one": _agent("plain", ["moderation"]),
        "three": _agent("plain", list(OUTPUT)),
        "early": _agent(
            "plain",
            list(OUTPUT),
            optimisticFirstStep=True,
            inputProcessors=[{**_guard("moderation"), "name": "in-moderation"}],
        ),
        "fused": {**_agent("plain", []), **fused},
        "redact": _agent("mailed", pii_first),
        "redact-fused": {
            **_agent("mailed", []),
            "outputProcessors": [_guard(p, merge_judge=False) for p in pii_first],
        },
    }
    return {
        "sidecars": {"r": {"address": sidecar, "timeout": 30}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": models,
        "agents": agents,
    }


@pytest.fixture(scope="module")
def replica(judge_server: GatedJudge) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    return Replica(
        "release", functools.partial(_config, judges_url=judge_server.base_url), {"JUDGE_KEY": SECRET}
    )


def _seen(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The caller's stream without what differs between two runs (ids, times)."""
    out: list[tuple[str, Any]] = []
    for chunk in chunks:
        payload = chunk.get("payload") or {}
        out.append((chunk["type"], payload.get("text") if chunk["type"] == "text-delta" else None))
    return out


async def _gated_run(
    orchestrator: OrchestratorProcess,
    judge: GatedJudge,
    agent: str,
    first: str,
    *gates: str,
    close: bool = True,
) -> tuple[list[dict[str, Any]], list[str]]:
    """A streamed run whose `gates` open when the caller has text holding `first`; the chunks, and
    the gated verdicts sent by then. The first window's verdict (its gate) comes only once the
    judge was asked about the last window (``Charlie``): the guards hold every part by then, and a
    guard asks about the last window only at a non-text part, after it answered that part."""
    if close:
        judge.close(first, *gates, first=first, once="Charlie")
    text = ""
    when_first: list[str] = []

    def on_text(delta: str) -> None:
        nonlocal text
        text += delta
        if first in text and not when_first:
            when_first.append("|".join(v for v in judge.verdicts if v != first) or "-")
            for gate in gates:
                judge.open(gate)

    chunks = await stream(orchestrator, agent, on_text)
    return chunks, when_first


@pytest.mark.parametrize("agent", ["one", "three", "early"])
async def test_the_first_window_reaches_the_caller_before_the_last_windows_verdict(
    orchestrator: OrchestratorProcess, judge_server: GatedJudge, agent: str
) -> None:
    chunks, when_first = await _gated_run(orchestrator, judge_server, agent, "Alpha", "Charlie")
    assert when_first == ["-"], "the first window's text came only after the last window's verdict"
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == "".join(PLAIN)
    # the stream is the one the old path (a fused session, no partial results) gives
    judge_server.close()
    twin = await stream(orchestrator, "fused")
    assert _seen(chunks) == _seen(twin)


async def test_a_fused_session_takes_no_partial_results_and_still_lets_every_window_go(
    orchestrator: OrchestratorProcess, judge_server: GatedJudge
) -> None:
    judge_server.close("Charlie")
    opener = threading.Timer(0.5, judge_server.open, ("Charlie",))  # the caller's text cannot open it
    opener.start()
    try:
        chunks, when_first = await _gated_run(orchestrator, judge_server, "fused", "Alpha", close=False)
    finally:
        opener.cancel()
    assert "Charlie" in when_first[0]  # every window's parts waited for the last verdict
    texts = [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"]
    assert "".join(texts) == "".join(PLAIN)


async def test_a_rewind_across_parts_let_go_early_lets_them_go_once(
    orchestrator: OrchestratorProcess, judge_server: GatedJudge
) -> None:
    # PII guard first: its redaction of the second window comes after the later guards let the
    # first window go on guesses, so they are rewound to the redacted window, across that release
    chunks, when_first = await _gated_run(orchestrator, judge_server, "redact", "Alpha", "Bravo", "Charlie")
    assert when_first == ["-"], "the first window's text came only after the second window's verdict"
    judge_server.close()
    twin = await stream(orchestrator, "redact-fused")
    # the same chunks; the violation now comes with its window's parts, not ahead of the answer's
    seen = _seen(chunks)
    flagged = seen.index(("data-procmesh-violation", None))
    assert "j**e@" in str(seen[flagged + 1][1])
    assert [c for c in seen if c[0] != "data-procmesh-violation"] == [
        c for c in _seen(twin) if c[0] != "data-procmesh-violation"
    ]
    texts = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert texts.count("Alpha") == 1
    assert EMAIL not in texts
    assert [v.get("processorId") for v in violations_of(chunks)] == ["pii-detector"]
    assert violations_of(chunks) == violations_of(twin)
