"""Cost control across two `procmesh-orchestrator` processes sharing one PostgreSQL database.

50 runs of one resource at once, half to each replica, against a limit that fits 10 calls:
each call reserves its cost in the shared ledger before it runs (the scope's row locked, so the
replicas' admissions queue), so exactly the 10 that fit are let through and the other 40 end in
the cost control's tripwire, whatever the interleaving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from tests.e2e.cost.support import ADA, BOB, KEYS, PER_CALL, admissions, config, generate_all, outcomes
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

DSN_ENV = "PROCMESH_COST_DSN"
RUNS = 50


def test_fifty_concurrent_runs_on_two_replicas_let_exactly_the_ten_that_fit_through(
    postgres_dsn: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    dsn = fresh_dsn(postgres_dsn)
    env = {"PROCMESH_API_KEYS": KEYS, DSN_ENV: dsn}
    cfg = config({"backend": "postgres", "dsnEnv": DSN_ENV, "maxConnections": 20})
    a = start_orchestrator(cfg, env=env)
    b = start_orchestrator(cfg, env=env)

    # another resource warms both replicas' pools: its spending is its own
    assert outcomes(asyncio.run(generate_all([a.http_url, b.http_url], BOB))) == {"let through": 2}
    targets = [a.http_url if i % 2 == 0 else b.http_url for i in range(RUNS)]
    bodies = asyncio.run(generate_all(targets, ADA))

    count = outcomes(bodies)
    print(f"\ncost control, {RUNS} concurrent runs on 2 replicas, a limit of 10 calls: {dict(count)}")
    assert count == {"let through": 10, "refused": 40}
    refused = [b["tripwire"] for b in bodies if b["status"] == "tripwire"]
    assert {t["reason"] for t in refused} == {"Cost control: estimated cost limit exceeded (0.05/0.05)"}
    assert {t["metadata"]["scopeKey"] for t in refused} == {"resource:user-ada"}
    assert all(t["metadata"]["usage"]["estimatedCost"] == pytest.approx(10 * PER_CALL) for t in refused)
    per_replica = [admissions(a.http_url), admissions(b.http_url)]
    print(f"admissions per replica: {per_replica}")
    assert sum(m.get("admitted", 0) for m in per_replica) == 10 + 2
    assert sum(m.get("refused", 0) for m in per_replica) == 40

    # the ledger holds the ten calls, settled at their actual cost
    with psycopg.connect(dsn) as conn:
        sql = "SELECT scope_key, amount, settled FROM cost_usage WHERE scope_key = 'resource:user-ada'"
        rows = conn.execute(sql).fetchall()
    assert rows == [("resource:user-ada", round(PER_CALL * 1e9), True)] * 10
