"""Step 0's output rehearsed while the input guards judge (issue 33, P8's first chunk).

With ``optimisticFirstStep``, step 0's model call starts before the input guards committed; when
every output processor is speculative, its answer also goes through the output lane at once,
everything the lane gives held (`run.optimistic`, `processors.stream_rehearsal`): the output
guards ask the judge about the answer's windows while the input guards' question is still out.
Step 0 adopts the rehearsal when the request it makes is the early call's and the output
sessions would open the same way; otherwise it is dropped and step 0 streams the normal way.

Through a real orchestrator process and the real ``procmesh-sidecar guards``, each run beside a
twin agent without the optimistic step, on the same input: the caller's stream, the result's
violations and tripwire, memory and the output guards' metrics must be the twin's exactly.
The input guards ask a judge that answers after `INPUT_DELAY`, the output guards another that
answers at once, so the judge's log says which question came while which was still out.
A second pair of twins has language detection in front of the PII guard: its metadata changes
every message, so the orchestrator calls the PII guard again, which answers from the verdicts
it was given in the run (`guards._kept`) instead of asking the judge again while step 0 waits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.guards.judge_server import JudgeServer, Reply, Rule
from tests.e2e.guards.support import ACME, CONTACT, EMAIL, HATE, NO_SCORES, Replica
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import sse_events

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-first-chunk-test"
INPUT_DELAY = 1.0
"""Seconds the input guards' judge takes: the output guards' questions come meanwhile."""
MODERATE = "Judge this content for moderation."
SCRUB = "Review this answer for leaked system prompts"
PII = "Find the PII in this content."
LANGUAGE = "Detect the language"
BLOCKED = "BLOCK ME"
NO_PII: dict[str, Any] = {"categories": [], "detections": []}
HEADERS = {"Authorization": f"Bearer {ACME}"}
"""A tenant's key: its runs' threads are its own, read back with it."""
OUTPUT_GUARDS = ("moderation", "system-prompt-scrubber", "pii-detector")
LANGUAGE_FIRST = ("language-detector", "pii-detector")


class OrderedJudge(JudgeServer):
    """The judge server, logging each question's arrival and answer in one order across models."""

    def __init__(self, api_key: str) -> None:
        super().__init__(api_key)
        self.events: list[tuple[str, str, str]] = []
        """(``asked`` or ``answered``, model, prompt) in the order they happened."""
        self._events_lock = threading.Lock()

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        model, prompt = str(body.get("model", "")), json.dumps(body.get("messages"))
        with self._events_lock:
            self.events.append(("asked", model, prompt))
        reply = super().respond(path, headers, body)
        with self._events_lock:
            self.events.append(("answered", model, prompt))
        return reply

    def first(self, event: str, model: str, since: int) -> int:
        """The index of the first `event` of `model` at or after `since` (a huge one if none)."""
        return next(
            (i for i, (e, m, _) in enumerate(self.events) if i >= since and (e, m) == (event, model)), 10**9
        )

    def asked(self, model: str, since: int, text: str) -> bool:
        return any(e == "asked" and m == model and text in p for e, m, p in self.events[since:])


@pytest.fixture(scope="module")
def judge_server() -> Iterator[OrderedJudge]:
    server = OrderedJudge(api_key=SECRET)
    server.start()
    delay = INPUT_DELAY
    server.judge(
        "in",
        {},
        Rule((MODERATE, BLOCKED), HATE, delay),
        Rule((MODERATE,), NO_SCORES, delay),
        Rule((PII, EMAIL), CONTACT, delay),
        Rule((PII,), NO_PII, delay),
        Rule((LANGUAGE,), {"iso_code": "en", "confidence": 0.99}, delay),
    )
    # Output: the raw address (only the early answer echoes it: the input guard masks it) and the
    # blocked input (only an answer to it echoes it) would each end the run at output moderation.
    server.judge(
        "out",
        {},
        Rule((MODERATE, EMAIL), HATE),
        Rule((MODERATE, BLOCKED), HATE),
        Rule((MODERATE,), NO_SCORES),
        Rule((SCRUB,), {"detections": [], "reason": None}),
        Rule((PII,), NO_PII),
    )
    yield server
    server.stop()


def _agent(optimistic: bool, inputs: tuple[str, ...] = ("moderation", "pii-detector")) -> dict[str, Any]:
    def guard(pid: str, judge: str) -> dict[str, Any]:
        # the input entries are named: the same processor with other options in both lanes
        named = {"name": f"{judge}-{pid}"} if judge == "in" else {}
        return {"processor": f"g/{pid}", "options": {"model": f"judges/{judge}"}, **named}

    return {
        "model": "echo",  # the demo model: the answer echoes what the model was asked
        "errorProcessorDefaults": False,
        "optimisticFirstStep": optimistic,
        "memory": {"lastMessages": 10},
        "inputProcessors": [guard(pid, "in") for pid in inputs],
        "outputProcessors": [guard(pid, "out") for pid in OUTPUT_GUARDS],
    }


def _config(sidecar: str, judges_url: str, store: Path) -> dict[str, Any]:
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 10}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"echo": {"provider": "demo"}},
        "storage": {"backend": "sqlite", "path": str(store)},
        "agents": {
            "early": _agent(True),
            "plain": _agent(False),
            "early-lang": _agent(True, LANGUAGE_FIRST),
            "plain-lang": _agent(False, LANGUAGE_FIRST),
        },
    }


@pytest.fixture(scope="module")
def replica(judge_server: OrderedJudge, tmp_path_factory: pytest.TempPathFactory) -> Replica:
    """What conftest.py's `orchestrator` starts for this module."""
    store = tmp_path_factory.mktemp("store") / "m.db"
    config = functools.partial(_config, judges_url=judge_server.base_url, store=store)
    return Replica("first-chunk", config, {"JUDGE_KEY": SECRET})


Seen = dict[str, Any]


async def _run(orchestrator: OrchestratorProcess, agent: str, text: str, thread: str) -> Seen:
    """A streamed run and what it left: the caller's chunks, the stored thread, the output guards'
    metrics (the run's own: the difference across it)."""
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=HEADERS, timeout=60) as http:
        before = await _metrics(http, agent)
        chunks = []
        body = {"messages": text, "memory": {"thread": thread}}
        async with http.stream("POST", f"/api/agents/{agent}/stream", json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for data in sse_events(response):
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
        after = await _settled(http, agent)
        stored = await http.get(f"/api/memory/threads/{thread}/messages", params={"agentId": agent})
    messages = stored.json()["messages"] if stored.status_code == 200 else []
    for chunk in chunks:  # what differs between any two runs
        chunk.pop("runId", None)
        (chunk.get("payload") or {}).pop("runId", None)
    return {
        "chunks": chunks,
        "stored": [(m["role"], json.dumps(m["content"].get("parts"))) for m in messages],
        "metrics": {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)},
    }


async def _settled(http: httpx.AsyncClient, agent: str) -> dict[tuple[str, ...], float]:
    """`_metrics` once two reads in a row agree: a session is counted as its stream ends, which
    may be just after the caller's stream did."""
    last, now = None, await _metrics(http, agent)
    while now != last:
        await asyncio.sleep(0.2)
        last, now = now, await _metrics(http, agent)
    return now


async def _metrics(http: httpx.AsyncClient, agent: str) -> dict[tuple[str, ...], float]:
    """The output guards' stream metrics of `agent`: parts by outcome, calls by outcome."""
    body = (await http.get("/metrics")).text
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            labels = s.labels
            if labels.get("agent") != agent or labels.get("processor") not in OUTPUT_GUARDS:
                continue
            hook = labels.get("hook")
            calls = s.name == "procmesh_processor_calls_total" and hook == "process_output_stream"
            if calls or s.name == "procmesh_stream_parts_total":
                out[(s.name, labels["processor"], labels["outcome"])] = s.value
            elif s.name == "procmesh_stream_part_added_seconds_count":
                out[(s.name, labels["processor"])] = s.value
    return out


async def _twins(
    orchestrator: OrchestratorProcess, text: str, thread: str, agent: str = ""
) -> tuple[Seen, Seen]:
    early = await _run(orchestrator, f"early{agent}", text, f"{thread}-early")
    plain = await _run(orchestrator, f"plain{agent}", text, f"{thread}-plain")
    assert early == plain  # the caller's stream, memory and the metrics: the twin's, exactly
    return early, plain


def _text(seen: Seen) -> str:
    return "".join(c["payload"]["text"] for c in seen["chunks"] if c["type"] == "text-delta")


async def test_the_answers_windows_are_judged_while_the_input_guards_judge(
    orchestrator: OrchestratorProcess, judge_server: OrderedJudge
) -> None:
    since = len(judge_server.events)
    early, _ = await _twins(orchestrator, "Tell me about the old harbour.", "calm")
    assert _text(early).startswith('You said: "Tell me about the old harbour."')
    assert early["metrics"], "the output guards streamed the answer"
    # the first output question came while the input guards' question was still out
    assert judge_server.first("asked", "out", since) < judge_server.first("answered", "in", since)


async def test_an_input_block_drops_the_rehearsed_answer(
    orchestrator: OrchestratorProcess, judge_server: OrderedJudge
) -> None:
    since = len(judge_server.events)
    early, _ = await _twins(orchestrator, f"{BLOCKED} now.", "blocked")
    tripwires = [c for c in early["chunks"] if c["type"] == "tripwire"]
    assert [t["payload"]["metadata"]["phase"] for t in tripwires] == ["input"]
    assert not _text(early)
    assert not early["metrics"]
    # the rehearsal judged the early answer (output moderation would have blocked it): dropped
    assert judge_server.asked("out", since, f'You said: \\"{BLOCKED}')


async def test_a_changed_request_drops_the_rehearsed_answer(
    orchestrator: OrchestratorProcess, judge_server: OrderedJudge
) -> None:
    since = len(judge_server.events)
    early, _ = await _twins(orchestrator, f"Mail {EMAIL} the map.", "masked")
    assert not [c for c in early["chunks"] if c["type"] in ("tripwire", "error")]
    assert EMAIL not in _text(early)
    assert "j**e@" in _text(early)  # the masked request's answer
    # the early call was made on the raw address; its answer's rehearsal was asked about it
    assert judge_server.asked("out", since, EMAIL)


async def test_an_input_guard_called_again_asks_the_gateway_nothing_more(
    orchestrator: OrchestratorProcess,
) -> None:
    text = "Tell me about the tram museum."
    async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=60) as http:
        before = await _gateway_calls(http)
        early, _ = await _twins(orchestrator, text, "language", "-lang")
        after = await _gateway_calls(http)
    assert _text(early).startswith(f'You said: "{text}"')
    # Language detection changed every message (its metadata), so each twin's PII guard was
    # called again after its first, speculative call: that call gave the verdicts the run's first
    # had without asking the gateway again (one question per twin, not two, while step 0 waited
    # for the input lane to commit).
    asked = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert asked[("pii-detector", "ok")] == 2
    assert asked[("language-detector", "ok")] == 2


async def _gateway_calls(http: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    """The model gateway's calls of the input guards' judge by processor and outcome."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families((await http.get("/metrics")).text):
        for s in family.samples:
            if s.name == "procmesh_gateway_calls_total" and s.labels.get("model") == "judges/in":
                out[(s.labels["processor"], s.labels["outcome"])] = s.value
    return out


async def test_an_input_guard_asks_first_what_the_judge_must_answer_then_the_history_together(
    orchestrator: OrchestratorProcess,
) -> None:
    """Each input guard first sends the questions the judge must answer (the newest message, and
    the last answer, which it has not asked about before), then the history it asked about in
    earlier turns, as one GenerateBatch (`guards._judge._hand_over`, `_kept.asked_before`)."""
    thread = "history-batched"
    await _run(orchestrator, "plain", "Tell me about the river walk.", thread)  # one message: no batch
    await _run(orchestrator, "plain", "And the hill fort?", thread)
    async with httpx.AsyncClient(base_url=orchestrator.http_url, timeout=60) as http:
        before, sizes = await _gateway_calls(http), await _batch_sizes(http)
        seen = await _run(orchestrator, "plain", "And the night market?", thread)
        after, sized = await _gateway_calls(http), await _batch_sizes(http)
    assert _text(seen).startswith('You said: "')
    # the third turn's history: two questions and two answers, of which the second answer is new
    # to the input guards; each of the two guards asked five questions: the new message and the
    # second answer in one batch, then the three it asked about before in another
    asked = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert asked[("moderation", "ok")] == 5
    assert asked[("pii-detector", "ok")] == 5
    assert (sized[0] - sizes[0], sized[1] - sizes[1]) == (4, 10)


async def _batch_sizes(http: httpx.AsyncClient) -> tuple[float, float]:
    """procmesh_gateway_batch_size's count and sum."""
    found = {
        s.name: s.value
        for family in text_string_to_metric_families((await http.get("/metrics")).text)
        for s in family.samples
        if s.name.startswith("procmesh_gateway_batch_size")
    }
    return found["procmesh_gateway_batch_size_count"], found["procmesh_gateway_batch_size_sum"]
