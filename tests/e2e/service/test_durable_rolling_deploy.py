"""A rolling deploy that drops one agent and adds another (issue 24, finding 10), with real
`procmesh-orchestrator` processes on one PostgreSQL and one Redis.

The old config has the agents ``durable-teller`` and ``old-teller``, the new one ``durable-teller``
and ``new-teller``. Durable runs of every agent are started; the replica serving them is
SIGKILLed mid-run. A replica of the other config takes over the runs of the agent both configs
have, and leaves those of the agent its config lacks (counted in
``procmesh_durable_runs_left_total{reason="agent"}``, logged, never failed: they stay
``running``) until a replica that has the agent starts and finishes them. Every run ends
``done``, taken over by a replica whose config has its agent, and its thread holds the turn once.
The agent both have changed between the configs too: the runs started under its old version are
resumed by the new replica, which counts them (``procmesh_durable_takeovers_other_config_total``).
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
from typing import Any

import httpx
import pytest

from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.durable_harness import (
    AGENT,
    AUTH,
    WAIT,
    Received,
    RedisServer,
    env_for,
    read_stream,
    replica_config,
    run_record,
    until,
)
from tests.e2e.service.test_durable_fencing import Witness, turn
from tests.e2e.service.test_durable_takeover import EXPECTED_TURN, Start, stream_body
from tests.integration.memory.pg import PostgresServer, fresh_dsn

pytestmark = pytest.mark.e2e

OLD_ONLY = "old-teller"
NEW_ONLY = "new-teller"
RUNS_PER_AGENT = 3
LEFT = re.compile(r'^procmesh_durable_runs_left_total\{reason="agent"\} (\S+)$', re.MULTILINE)
OTHER_CONFIG = re.compile(r"^procmesh_durable_takeovers_other_config_total (\S+)$", re.MULTILINE)


def config_with(*agents: str) -> dict[str, Any]:
    """The replicas' config (`replica_config`) with these durable agents, each the same teller."""
    config = replica_config(delay_ms=100, lease_seconds=1.0, claim_interval_seconds=0.2)
    teller = config["agents"][AGENT]
    config["agents"] = {name: copy.deepcopy(teller) for name in agents}
    return config


OLD = config_with(AGENT, OLD_ONLY)
NEW = config_with(AGENT, NEW_ONLY)
NEW["agents"][AGENT]["memory"]["lastMessages"] = 30  # the agent both have changed too: another version


async def begin(base_url: str, agent: str, thread: str) -> Received:
    """Start a durable run and read its first events (then the client goes away; the run goes on)."""
    got = Received()
    async with (
        httpx.AsyncClient(timeout=WAIT) as client,
        client.stream(
            "POST", f"{base_url}/api/agents/{agent}/stream", json=stream_body(thread), headers=AUTH
        ) as response,
    ):
        await read_stream(response, got, stop_after=3)
    assert got.run_id
    return got


def start_runs(base_url: str, agents: list[str], tag: str) -> dict[str, tuple[str, str]]:
    """run id: (agent, thread), for RUNS_PER_AGENT runs of each agent, started together."""

    async def all_of() -> list[tuple[str, str, Received]]:
        jobs = [(a, f"th-{tag}-{a}-{n}") for a in agents for n in range(RUNS_PER_AGENT)]
        got = await asyncio.gather(*(begin(base_url, a, t) for a, t in jobs))
        return [(a, t, g) for (a, t), g in zip(jobs, got, strict=True)]

    return {g.run_id: (a, t) for a, t, g in asyncio.run(all_of())}


def kill(process: OrchestratorProcess) -> None:
    os.killpg(process.proc.pid, signal.SIGKILL)
    process.proc.wait(timeout=WAIT)


def sample(process: OrchestratorProcess, pattern: re.Pattern[str]) -> float:
    found = pattern.search(httpx.get(f"{process.http_url}/metrics", timeout=WAIT).text)
    return float(found[1]) if found else 0.0


def left_count(process: OrchestratorProcess) -> float:
    return sample(process, LEFT)


def wait_done(witness: Witness, run_ids: list[str], what: str) -> None:
    asyncio.run(
        until(lambda: all((witness.row(r) or ("",))[0] == "done" for r in run_ids), what, timeout=WAIT * 2)
    )


def test_every_run_finishes_on_a_replica_that_has_its_agent(
    start_orchestrator: Start, postgres: PostgresServer, redis_server: RedisServer
) -> None:
    dsn = fresh_dsn(postgres.dsn)
    env = env_for(dsn, redis_server.url)
    witness = Witness(dsn, redis_server)
    try:
        old = start_orchestrator(OLD, "--log-format", "json", env=env)
        new = start_orchestrator(NEW, "--log-format", "json", env=env)

        # 1. the old replica dies with runs of both its agents; the new one has only one of them
        first = start_runs(old.http_url, [AGENT, OLD_ONLY], "a")
        kill(old)
        shared = [r for r, (a, _) in first.items() if a == AGENT]
        old_only = [r for r, (a, _) in first.items() if a == OLD_ONLY]
        wait_done(witness, shared, "the new replica finishes the runs of the agent both configs have")
        asyncio.run(
            until(lambda: left_count(new) >= len(old_only), "the new replica counts the runs it leaves")
        )
        assert "left for a replica that has them" in new.log()
        # the runs of the agent both have were started under the old version of its config
        assert sample(new, OTHER_CONFIG) == len(shared)
        assert new.log().count("was started under config version") == len(shared)
        for run_id in old_only:  # left, never failed, never claimed by the replica without the agent
            status, owner, epoch = (witness.row(run_id) or ())[:3]
            assert (status, epoch) == ("running", 1), (run_id, status, owner, epoch)

        # 2. a replica of the old config comes (back) and finishes them; the new one dies with runs
        # of its new agent, which the old-config replica leaves in turn
        old_again = start_orchestrator(OLD, "--log-format", "json", env=env)
        wait_done(witness, old_only, "a replica with the old agent finishes its runs")
        second = start_runs(new.http_url, [NEW_ONLY], "b")
        kill(new)
        asyncio.run(
            until(
                lambda: left_count(old_again) >= len(second),
                "the old-config replica leaves the new agent's runs",
            )
        )
        assert all((witness.row(r) or ("",))[0] == "running" for r in second)
        new_again = start_orchestrator(NEW, "--log-format", "json", env=env)
        wait_done(witness, list(second), "a replica with the new agent finishes its runs")

        runs = {**first, **second}
        takers = {"new": new, "old_again": old_again, "new_again": new_again}
        has = {"new": NEW, "old_again": OLD, "new_again": NEW}
        for run_id, (agent, thread) in runs.items():
            taken_by = [name for name, r in takers.items() if f"run {run_id} taken over" in r.log()]
            assert len(taken_by) == 1, (run_id, agent, taken_by)
            assert agent in has[taken_by[0]]["agents"], (run_id, agent, taken_by)
            record = run_record(new_again.http_url, run_id)
            assert (record["status"], record["agentId"], record["error"]) == ("done", agent, None), record
            messages = witness.messages(thread)
            assert turn(messages) == EXPECTED_TURN, (run_id, thread)
        for replica in (new, old_again, new_again):
            assert "could not be resumed" not in replica.log()
        print(
            f"\nrolling deploy: {len(runs)} durable runs of 3 agents over 4 replicas of 2 configs, all "
            f"done, each taken over by a replica that has its agent, none failed; runs the old-config "
            f"replica left for another: {left_count(old_again):.0f}"
        )
    finally:
        witness.close()
