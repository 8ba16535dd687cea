"""The golden set (tests/fixtures/guard_golden_windows.json): every labelled window through each
LLM-judged guard alone and through the five together, with real processes (the orchestrator, the
built-in sidecar it starts, the scripted judge behind its model gateway). Each guard alone must
decide as labelled, and together (however the guards are planned: separate calls, merged, cached,
cheap checks first) exactly as alone. Bench P8's ``p8_verdicts_equal`` is the same comparison.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_sidecars.builtins.guards import language, moderation, pii, prompt_injection
from tests.e2e.guards.golden import INPUT_LANE, OUTPUT_LANE, config, judge_window
from tests.e2e.guards.golden_judge import GoldenJudge, load_golden
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-golden-judge-secret"
WINDOWS = load_golden()


@pytest.fixture(scope="module")
def judge() -> Iterator[GoldenJudge]:
    server = GoldenJudge(WINDOWS, api_key=SECRET)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def orchestrator(
    judge: GoldenJudge, start_orchestrator: Callable[..., OrchestratorProcess]
) -> OrchestratorProcess:
    models, agents = config(WINDOWS, "judges/golden")
    return start_orchestrator(
        {
            "providers": {"judges": {"kind": "openai", "baseUrl": judge.base_url, "apiKeyEnv": "JUDGE_KEY"}},
            "models": models,
            "agents": agents,
        },
        env={"PROCMESH_API_KEYS": API_KEYS, "JUDGE_KEY": SECRET},
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(orchestrator: OrchestratorProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=60) as client:
        yield client


async def test_the_golden_set_has_40_windows_and_every_decision_of_every_guard() -> None:
    assert len(WINDOWS) >= 40
    texts = [w["text"] for w in WINDOWS]
    assert len(set(texts)) == len(texts)
    assert not [(a, b) for a in texts for b in texts if a != b and a in b]  # the judge keys by text
    for phase, lane in (("input", INPUT_LANE), ("output", OUTPUT_LANE)):
        for g in lane:
            seen = {w["labels"][g] for w in WINDOWS if w["phase"] == phase}
            flags = "redact" if g in ("pii-detector", "system-prompt-scrubber") else "block"
            assert seen == {"allow", flags}, (phase, g, seen)


@pytest.mark.parametrize("window", WINDOWS, ids=[w["id"] for w in WINDOWS])
async def test_each_guard_alone_decides_as_labelled_and_together_as_alone(
    http: httpx.AsyncClient, judge: GoldenJudge, window: dict[str, Any]
) -> None:
    before = judge.count("golden"), judge.count("golden-together")
    assert await judge_window(http, window) == []
    # both judged by the judge, not settled by anything else (a cache, a cheap check)
    assert judge.count("golden") > before[0]
    assert judge.count("golden-together") > before[1]


async def test_the_judge_gives_a_merged_schema_each_guards_own_verdict(judge: GoldenJudge) -> None:
    """What the planner's one call per window asks (a section per guard) gets, per section, what
    each guard's own call gets: the bench and the test compare planned with alone on equal terms."""
    labels = {"prompt-injection-detector": "block", "pii-detector": "redact"}
    window = next(w for w in WINDOWS if labels.items() <= w["labels"].items())  # both flag it
    injection_types = prompt_injection.DEFAULT_DETECTION_TYPES
    schemas = {
        "moderation": moderation._schema(moderation.DEFAULT_CATEGORIES),
        "prompt-injection-detector": prompt_injection._schema(injection_types, rewrite=False),
        "pii-detector": pii._schema(pii.DEFAULT_DETECTION_TYPES),
        "language-detector": language._schema(False),
    }
    merged = {"type": "object", "properties": schemas, "required": list(schemas)}

    async def ask(schema: dict[str, Any]) -> dict[str, Any]:
        body = {
            "model": "merged-check",
            "messages": [{"role": "user", "content": f'Content: "{window["text"]}"'}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
        }
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                f"{judge.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {SECRET}"}
            )
        answer: dict[str, Any] = json.loads(response.json()["choices"][0]["message"]["content"])
        return answer

    alone = await asyncio.gather(*(ask(s) for s in schemas.values()))
    together = await ask(merged)
    assert together == dict(zip(schemas, alone, strict=True))
    assert together["prompt-injection-detector"] == window["answers"]["prompt-injection-detector"]
    assert together["pii-detector"] == window["answers"]["pii-detector"]
    assert together["language-detector"] == {"iso_code": "en", "confidence": 0.99}
