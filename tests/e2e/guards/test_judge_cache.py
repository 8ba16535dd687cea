"""The model gateway's verdict cache end to end (issue 33 item 3): `procmesh-sidecar guards` as real
processes, real orchestrator processes sharing a real redis-server, and the scripted judge server
(`judge_server.py`) counting the questions it is asked.

A second turn re-sending the history is judged only for its new messages; a second replica
sharing Redis pays no judge call for a question the first asked; a guard option taken from the
request context never hands one tenant a decision made for another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.guards.support import ACME, GLOBEX, MILD, NO_SCORES, generate, guard, start_replica
from tests.e2e.service.conftest import OrchestratorProcess, redis_server
from tests.e2e.service.durable_harness import RedisServer
from tests.integration.service.support import AUTH

__all__ = ["redis_server"]

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-judge-secret-of-the-cache-tests"


def _agent(**options: Any) -> dict[str, Any]:
    return {
        "model": "echo",
        "errorProcessorDefaults": False,
        "inputProcessors": [guard("moderation", "mod", **options)],
    }


def _config(sidecar: str, judges_url: str, redis_url: str) -> dict[str, Any]:
    by_tenant = {
        "fromContext": "resourceId",
        "cases": {"acme": "acme policy: moderate.", "globex": "globex policy: moderate."},
    }
    return {
        "sidecars": {"g": {"address": sidecar, "timeout": 10}},
        "providers": {"judges": {"kind": "openai", "baseUrl": judges_url, "apiKeyEnv": "JUDGE_KEY"}},
        "models": {"echo": {"provider": "demo"}},
        "judgeCache": {"enabled": True, "redis": {"url": redis_url}},
        "agents": {
            "guarded": _agent(),
            # a question shaped by the tenant (its instructions) and a decision shaped by it (threshold)
            "by-instructions": _agent(instructions={**by_tenant, "default": "moderate."}),
            "by-threshold": _agent(
                threshold={"fromContext": "resourceId", "cases": {"acme": 0.5}, "default": 0.9}
            ),
        },
    }


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    # the acme policy flags MILD; any other prompt scores nothing
    server.judge("mod", NO_SCORES, Rule(("acme policy", "MILD"), MILD), Rule(("threshold MILD",), MILD))
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(
    sidecar_dir: Path,
    judge_server: JudgeServer,
    redis_server: RedisServer,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> AsyncIterator[list[OrchestratorProcess]]:
    started = [
        await start_replica(
            sidecar_dir,
            f"r{i}",
            lambda sidecar: _config(sidecar, judge_server.base_url, redis_server.url),
            start_orchestrator,
            {"JUDGE_KEY": SECRET},
        )
        for i in (1, 2)
    ]
    yield [orchestrator for _, orchestrator in started]
    for sidecar, _ in started:
        sidecar.stop(grace=2.0)


def _asked(judge_server: JudgeServer, text: str) -> int:
    """How many times the judge was asked to judge exactly `text`."""
    return sum(f'Content: "{text}"' in content for content in judge_server.judged("mod"))


def metric(orchestrator: OrchestratorProcess, name: str, label: str) -> dict[str, float]:
    """`name`'s samples summed by the value of `label`."""
    body = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name:
                out[sample.labels[label]] = out.get(sample.labels[label], 0.0) + sample.value
    return out


async def test_a_second_turn_resending_history_is_judged_only_for_its_new_messages(
    replicas: list[OrchestratorProcess], judge_server: JudgeServer
) -> None:
    first, second = "Turn one asks about trains.", "Turn two asks about boats."
    one = await generate(replicas[0], "guarded", [{"role": "user", "content": first}])
    history = [{"role": "user", "content": first}, {"role": "assistant", "content": one["text"]}]
    await generate(replicas[0], "guarded", [*history, {"role": "user", "content": second}])
    assert _asked(judge_server, first) == 1  # judged once, in turn one
    assert _asked(judge_server, second) == 1
    assert _asked(judge_server, one["text"]) == 1  # the assistant's answer, new in turn two
    saved = metric(replicas[0], "procmesh_judge_calls_saved_total", "by")
    assert saved.get("cache", 0) >= 1


async def test_a_ten_turn_conversation_judges_each_message_once(
    replicas: list[OrchestratorProcess], judge_server: JudgeServer
) -> None:
    """The client re-sends the whole history each turn: turn t holds 2t - 1 messages, so without
    the cache the guard would ask 1 + 3 + ... + 19 = 100 questions; with it, one per message."""
    before = len(judge_server.judged("mod"))
    history: list[dict[str, str]] = []
    for turn in range(1, 11):
        history.append({"role": "user", "content": f"Question {turn} of the long conversation."})
        answer = await generate(replicas[0], "guarded", history)
        history.append({"role": "assistant", "content": answer["text"]})
    assert len(judge_server.judged("mod")) - before == 19


async def test_a_second_replica_sharing_redis_pays_no_judge_call(
    replicas: list[OrchestratorProcess], judge_server: JudgeServer
) -> None:
    text = "A question both replicas get."
    await generate(replicas[0], "guarded", [{"role": "user", "content": text}])
    await generate(replicas[1], "guarded", [{"role": "user", "content": text}])
    assert _asked(judge_server, text) == 1
    assert metric(replicas[1], "procmesh_judge_cache_lookups_total", "result").get("redis", 0) >= 1


async def _per_tenant(orchestrator: OrchestratorProcess, agent: str, text: str) -> None:
    """`text` through `agent` for acme (blocked: MILD flags for it) and then globex (passed)."""
    blocked = await generate(orchestrator, agent, text, headers={"Authorization": f"Bearer {ACME}"})
    passed = await generate(orchestrator, agent, text, headers={"Authorization": f"Bearer {GLOBEX}"})
    assert blocked["tripwire"]["processorId"] == "moderation"
    assert passed.get("tripwire") is None


async def test_options_from_the_request_context_never_hand_a_tenant_another_tenants_decision(
    replicas: list[OrchestratorProcess], judge_server: JudgeServer
) -> None:
    # instructions per tenant: two questions, two judge calls, two different decisions
    await _per_tenant(replicas[0], "by-instructions", "MILD words about the instructions.")
    assert _asked(judge_server, "MILD words about the instructions.") == 2
    # a threshold per tenant: the same question (its answer reused), each tenant's own decision
    await _per_tenant(replicas[0], "by-threshold", "threshold MILD words.")
    assert _asked(judge_server, "threshold MILD words.") == 1


async def test_a_verdict_expires_after_its_ttl(
    sidecar_dir: Path, judge_server: JudgeServer, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    """A replica keeping verdicts for 0.2 s in memory only: the same question is asked again once
    it expired (polled, no wall-clock assert), and not before its first answer was reused."""

    def config(sidecar: str) -> dict[str, Any]:
        return {
            **_config(sidecar, judge_server.base_url, ""),
            "judgeCache": {"enabled": True, "ttlSeconds": 0.2},
        }

    sidecar, orchestrator = await start_replica(
        sidecar_dir, "ttl", config, start_orchestrator, {"JUDGE_KEY": SECRET}
    )
    try:
        text = "A question that expires."
        await generate(orchestrator, "guarded", text)
        await generate(orchestrator, "guarded", text)
        first = _asked(judge_server, text)
        reused = metric(orchestrator, "procmesh_judge_cache_lookups_total", "result").get("memory", 0)
        assert first == 1 or reused == 0  # a slow machine may see it expire between the two runs
        for _ in range(200):
            await generate(orchestrator, "guarded", text)
            if _asked(judge_server, text) > first:
                break
            await asyncio.sleep(0.05)
        assert _asked(judge_server, text) > first
    finally:
        sidecar.stop(grace=2.0)
