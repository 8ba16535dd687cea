"""What the cost-control tests share: the config, concurrent generate calls, metric reads."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

KEYS = "key-ada=user-ada,key-bob=user-bob"
ADA = {"Authorization": "Bearer key-ada"}
BOB = {"Authorization": "Bearer key-bob"}
PER_CALL = 0.005
"""What one scripted call costs: 5 output tokens at 1000 per million (input tokens are free)."""
PRICES = {"input": 0.0, "output": 1000.0}


def config(storage: dict[str, Any], **cost: Any) -> dict[str, Any]:
    """One agent, `spender`, whose scripted model answers every call with 10 input and 5 output
    tokens; a call holds exactly what it will cost (``reserveOutputTokens: 5``, input free)."""
    answer = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}
    limit = {"maxCost": 10 * PER_CALL, "scope": "resource", "window": "30d", "reserveOutputTokens": 5}
    return {
        "storage": storage,
        "models": {"main": {"provider": "scripted", "responses": [answer] * 200}},
        "prices": {"main": PRICES},
        "agents": {
            "spender": {
                "model": "main",
                "errorProcessorDefaults": False,
                "costControl": {**limit, **cost},
            }
        },
    }


async def generate_all(targets: list[str], headers: dict[str, str]) -> list[dict[str, Any]]:
    """One generate call per target URL, all at once; their bodies in order."""
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:

        async def one(base_url: str) -> dict[str, Any]:
            response = await http.post(f"{base_url}/api/agents/spender/generate", json={"messages": "hi"})
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        return list(await asyncio.gather(*(one(url) for url in targets)))


def outcomes(bodies: list[dict[str, Any]]) -> Counter[str]:
    """How many runs succeeded, and how many the cost control's tripwire refused."""
    count: Counter[str] = Counter()
    for body in bodies:
        if body["status"] == "success":
            count["let through"] += 1
        elif body["status"] == "tripwire" and body["tripwire"]["processorId"] == "token-cost-control":
            count["refused"] += 1
        else:
            count[f"other: {body['status']} {body.get('error')}"] += 1
    return count


def admissions(base_url: str) -> dict[str, float]:
    """procmesh_cost_admissions_total of agent `spender` by outcome, from /metrics."""
    text = httpx.get(f"{base_url}/metrics", headers=ADA).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "procmesh_cost_admissions_total" and sample.labels["agent"] == "spender":
                out[sample.labels["outcome"]] = sample.value
    return out
