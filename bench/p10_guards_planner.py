"""P8 (issue 33, the guard planner): five LLM-judged guards, judge calls and added latency.

The built-in moderation, prompt-injection, PII, language and system-prompt-scrubber guards
(input lane: injection, moderation, language, PII; output lane: moderation, scrubber, PII; the
options of ``tests/e2e/guards/golden.py``) judged by a scripted OpenAI-compatible judge
(``tests/e2e/guards/golden_judge.py``) that answers any schema, a merged one with a section per
guard too, after 200 ms, and counts requests per judge model; it runs in a process of its own
(``bench/p8_judge.py``), as a real judge is a remote service, and the reference engine asks the
same judge process. A real orchestrator process starts
the built-in sidecar, whose guards reach the judge through its model gateway; everything goes
through the HTTP API, as a client's runs do.

- Judge calls: a 10-turn conversation, the client re-sending the history every turn (turn t sends
  2t-1 messages), short answers and then a 2,000-character answer streamed word by word; the
  judge calls procmesh made against those the reference engine (@mastra/core's own five guards,
  ``bench/reference.mjs``) made on the same conversation and judge. The reference's calls are
  counted with the judge answering at once: they are awaited one after another, so their number
  does not depend on the delay, and at 200 ms each the conversation would take minutes.
- Added time to the first streamed chunk: a conversation's tenth turn, after its first nine turns
  ran through the same guards (a new conversation in every round, so no verdict comes from an
  earlier round; its own history's verdicts come from the verdict cache, as in the counted
  conversation), with the guards against without, alternating; beside it the judge's own round
  trip. The guarded agents run as a user runs guarded streams: `judgeCache` on and
  `optimisticFirstStep` (the model starts while the input guards judge). Beside it a one-message
  turn under 10 characters (``p8_first_chunk_short_added_ms``): the language detector does not
  ask about it, and the other guards' merged call must not wait for its question.
- Equal verdicts: the golden set (tests/fixtures/guard_golden_windows.json) through each guard
  alone and the five together (`golden.judge_all`), with a judge that answers at once.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import ROUNDS, Reference, figure, start_orchestrator
from bench.p8_judge import JudgeProcess
from tests.e2e.guards import golden
from tests.e2e.guards.golden_judge import load_golden
from tests.integration.service.support import sse_events

JUDGE_SECONDS = 0.2
KEY = "bench-key-0123456789"
JUDGE_KEY = "sk-bench-judge"
TURNS = 10
SHORT_ANSWER = "Hi there, welcome to the old harbour."
_TOPICS = [
    "the old harbour", "the river walk", "the hill fort", "the glass market", "the tram museum",
    "the botanic garden", "the north beach", "the stone bridge", "the clock tower", "the night market",
]  # fmt: skip


def _turn(tag: str, t: int) -> tuple[str, str]:
    """Turn `t`'s question and (before the last) its short answer, unique to `tag`."""
    topic = _TOPICS[t % len(_TOPICS)]
    question = f"{tag} question {t}: what should a first-time visitor know about {topic}?"
    answer = f"{tag} answer {t}: {topic} is worth an hour in the morning, before the tour groups arrive."
    return question, answer


def long_answer(tag: str) -> str:
    """At least 2,000 characters, in sentences of about 90."""
    sentences: list[str] = []
    while len(" ".join(sentences)) < 2000:
        topic = _TOPICS[len(sentences) % len(_TOPICS)]
        where = "where the locals take a slow coffee and watch the boats"
        sentences.append(f"{tag} stop {len(sentences) + 1:02d} is {topic}, {where}.")
    return " ".join(sentences)


def words(text: str) -> list[str]:
    """`text` as a model streams it: a delta per word."""
    parts = text.split(" ")
    return [parts[0], *(f" {w}" for w in parts[1:])]


def conversation(tag: str) -> list[tuple[list[dict[str, str]], str]]:
    """Each turn's messages (the whole history re-sent) and its answer; the last answer is long."""
    turns: list[tuple[list[dict[str, str]], str]] = []
    history: list[dict[str, str]] = []
    for t in range(1, TURNS + 1):
        question, answer = _turn(tag, t)
        if t == TURNS:
            answer = long_answer(tag)
        history = [*history, {"role": "user", "content": question}]
        turns.append((history, answer))
        history = [*history, {"role": "assistant", "content": answer}]
    return turns


def _config(judge_url: str, scripts: dict[str, list[str]]) -> str:
    """The orchestrator's config: P8's agents (one scripted model each, its answers in order) and the
    golden set's."""
    models, agents = golden.config(load_golden(), "judges/golden")
    for name, answers in scripts.items():
        models[name] = {"provider": "scripted", "responses": [{"deltas": words(a)} for a in answers]}
        guarded = golden.lanes("judges/p8") if name.endswith("-guarded") else {}
        if guarded:  # what a user turns on for guarded streams: the model starts while guards judge
            guarded["optimisticFirstStep"] = True
        agents[name] = {"model": name, "errorProcessorDefaults": False, **guarded}
    providers = {"judges": {"kind": "openai", "baseUrl": judge_url, "apiKeyEnv": "JUDGE_KEY"}}
    # the verdict cache (in process): history re-sent every turn is judged once
    config = {"providers": providers, "models": models, "agents": agents, "judgeCache": {"enabled": True}}
    return json.dumps(config)  # JSON is YAML


async def _stream(http: httpx.AsyncClient, agent: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    """A streamed run: milliseconds to its first text delta, and the whole text."""
    t0 = time.perf_counter()
    first, text = None, ""
    async with http.stream("POST", f"/api/agents/{agent}/stream", json={"messages": messages}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"P8: {agent} answered {response.status_code}: {await response.aread()!r}")
        async for data in sse_events(response):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk["type"] in ("tripwire", "error"):
                raise RuntimeError(f"P8: {agent}: {chunk}")
            if chunk["type"] == "text-delta":
                first = first if first is not None else (time.perf_counter() - t0) * 1000
                text += chunk["payload"]["text"]
    if first is None:
        raise RuntimeError(f"P8: {agent} streamed no text")
    return first, text


_ANY = {"type": "object"}


async def _round_trip(http: httpx.AsyncClient, judge: JudgeProcess, n: int = 5) -> float:
    """Median milliseconds of a judge call made directly (what one judge round trip costs)."""
    body = {
        "model": "round-trip",
        "messages": [{"role": "user", "content": 'Content: "hello"'}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": _ANY}},
    }
    auth = {"Authorization": f"Bearer {JUDGE_KEY}"}
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = await http.post(f"{judge.base_url}/chat/completions", json=body, headers=auth)
        response.raise_for_status()
        ms.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ms)


async def measure(reference: Reference | None) -> dict[str, Any]:
    """Judge calls per conversation (procmesh, the reference), first-chunk added time, golden set."""
    round_tags = [f"R{i}" for i in range(1 + ROUNDS)]  # the warm-up round too
    convo = conversation("C")
    scripts = {
        "p8-convo-guarded": [answer for _, answer in convo],
        "p8-warm-guarded": [answer for tag in round_tags for _, answer in conversation(tag)[:-1]],
        "p8-turn-guarded": [conversation(tag)[-1][1] for tag in round_tags],
        "p8-turn-bare": [conversation(tag)[-1][1] for tag in round_tags],
        "p8-short-guarded": [SHORT_ANSWER for _ in round_tags],
        "p8-short-bare": [SHORT_ANSWER for _ in round_tags],
    }
    # only P8's own judge model and the round trip wait: the counted and the checked ones need not
    delays = {"golden": 0.0, "golden-together": 0.0, "reference": 0.0}
    judge = await JudgeProcess.start(JUDGE_SECONDS, JUDGE_KEY, delays)
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="pm-bench-p8-guards-") as tmp:
            orchestrator = await asyncio.to_thread(
                start_orchestrator,
                Path(tmp),
                _config(judge.base_url, scripts),
                f"{KEY}=@operator",
                {"JUDGE_KEY": JUDGE_KEY},
            )
            try:
                url = f"http://127.0.0.1:{orchestrator.port}"
                headers = {"Authorization": f"Bearer {KEY}"}
                async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
                    results.update(await _measure(http, judge, reference, convo, round_tags))
            finally:
                await orchestrator.stop()
    finally:
        await judge.stop()
    return results


async def _measure(
    http: httpx.AsyncClient,
    judge: JudgeProcess,
    reference: Reference | None,
    convo: list[tuple[list[dict[str, str]], str]],
    round_tags: list[str],
) -> dict[str, Any]:
    results: dict[str, Any] = {"p8_judge_round_trip_ms": await _round_trip(http, judge)}
    per_turn = []
    for messages, answer in convo:
        before = await judge.count("p8")
        _, text = await _stream(http, "p8-convo-guarded", messages)
        if text != answer:
            raise RuntimeError(f"P8: the guarded conversation changed an answer: {text[:200]!r}")
        per_turn.append(await judge.count("p8") - before)
    calls = sum(per_turn)
    results.update(
        p8_answer_chars=len(convo[-1][1]),
        p8_judge_calls_procmesh=calls,
        p8_judge_calls_procmesh_per_turn=per_turn,
        p8_judge_calls_reference=None,
        p8_judge_calls_reference_per_turn=None,
        p8_judge_calls_ratio_vs_reference=None,
    )
    if reference is not None:
        ref_turns = []
        for messages, answer in convo:
            before = await judge.count("reference")
            await reference.ask(
                run="judged",
                messages=messages,
                deltas=words(answer),
                judgeUrl=judge.base_url,
                judgeModel="reference",
                judgeKey=JUDGE_KEY,
            )
            ref_turns.append(await judge.count("reference") - before)
        results.update(
            p8_judge_calls_reference=sum(ref_turns),
            p8_judge_calls_reference_per_turn=ref_turns,
            p8_judge_calls_ratio_vs_reference=calls / sum(ref_turns),
        )

    guarded: list[float] = []
    bare: list[float] = []
    for i, tag in enumerate(round_tags):  # alternating; the first round is a warm-up
        turns = conversation(tag)  # a conversation no earlier round has seen
        for messages, _ in turns[:-1]:  # its first nine turns, as the client had them judged
            await _stream(http, "p8-warm-guarded", messages)
        messages = turns[-1][0]  # the tenth turn, timed: its history was judged in those turns
        g, _ = await _stream(http, "p8-turn-guarded", messages)
        b, _ = await _stream(http, "p8-turn-bare", messages)
        if i:
            guarded.append(g)
            bare.append(b)
    added = [g - b for g, b in zip(guarded, bare, strict=True)]
    median_added, spread = figure(added)
    short: list[float] = []
    for i, tag in enumerate(round_tags):  # "Hi R0!": new each round, so no verdict is cached
        messages = [{"role": "user", "content": f"Hi {tag}!"}]
        g, _ = await _stream(http, "p8-short-guarded", messages)
        b, _ = await _stream(http, "p8-short-bare", messages)
        if i:
            short.append(g - b)
    short_added, short_spread = figure(short)
    results.update(
        p8_first_chunk_ms_guarded=statistics.median(guarded),
        p8_first_chunk_ms_bare=statistics.median(bare),
        p8_first_chunk_added_ms=median_added,
        p8_first_chunk_added_ms_spread=spread,
        p8_first_chunk_added_vs_round_trip=median_added / results["p8_judge_round_trip_ms"],
        p8_first_chunk_short_added_ms=short_added,
        p8_first_chunk_short_added_ms_spread=short_spread,
    )
    windows = load_golden()
    problems = await golden.judge_all(http, windows)
    results.update(
        p8_verdicts_equal=not problems,
        p8_golden_windows=len(windows),
        p8_golden_differences=problems[:10],
    )
    return results
