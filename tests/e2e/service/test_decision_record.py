"""The decision record (issue 31 item 1) through a real `procmesh-orchestrator` process and real
sidecar processes: a run with a rewriting stream processor, a fail-open failure and a guard in
``mode: monitor``, and a run a blocking guard aborts, record exactly those decisions, with hashes
and no content; with ``recordContent`` the store keeps what each processor saw. A tenant reads its
own runs' records only (another's is a 404, as for none); ``procmesh runs decisions`` prints them;
the retention purges old records as later runs write theirs, and deleting a thread deletes its
runs' records.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import yaml

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.decision_support import ADA, DEMO_AGENT, OPERATOR, WEATHER_TOOL, jailbreak_guard

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

KEYS = "op-key=@operator,ada-key=ada,bob-key=bob"
BOB = {"Authorization": "Bearer bob-key"}
TEXT = "please jailbreak"


def config(guards: str, faulty: str, db: str, *, content: bool) -> dict[str, Any]:
    return {
        "sidecars": {"guards": {"address": guards}, "faulty": {"address": faulty}},
        "models": {"demo": {"provider": "demo"}},
        "storage": {"path": db},
        "decisions": {"record": True, "recordContent": content, "retentionDays": 1},
        "tools": {"weather": WEATHER_TOOL},
        "agents": {
            "rec": {
                **DEMO_AGENT,
                "tools": ["weather"],
                "memory": {"lastMessages": 10},
                "recordInputs": True,
                "inputProcessors": [jailbreak_guard()],
            },
            "a": {
                **DEMO_AGENT,
                "memory": {"lastMessages": 10},
                "inputProcessors": [
                    {"processor": "faulty/raiser", "onFailure": "fail-open"},
                    {
                        "processor": "guards/topic-guard",
                        "options": {"words": ["jailbreak"]},
                        "mode": "monitor",
                    },
                ],
                "outputProcessors": [{"processor": "guards/word-filter", "options": {"words": ["darn"]}}],
            },
            "blocked": {
                **DEMO_AGENT,
                "inputProcessors": [jailbreak_guard()],
            },
        },
    }


class Stack:
    def __init__(self, proc: OrchestratorProcess, db: Path, config_path: Path) -> None:
        self.proc = proc
        self.db = db
        self.config_path = config_path
        self.http = httpx.AsyncClient(base_url=proc.http_url, timeout=30)

    async def generate(self, agent: str, headers: dict[str, str], **body: Any) -> dict[str, Any]:
        response = await self.http.post(
            f"/api/agents/{agent}/generate", json={"messages": TEXT, **body}, headers=headers
        )
        return response.json()

    def rows(self, sql: str, *args: Any) -> list[Any]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, args).fetchall()


async def _stack(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp: Path,
    name: str,
    *,
    content: bool,
) -> Stack:
    guards = start_sidecar("examples", name=f"{name}-guards")
    faulty = start_sidecar(name=f"{name}-faulty", module="tests.fixtures.faulty")
    await asyncio.gather(guards.wait_ready(), faulty.wait_ready())
    db = tmp / "memory.db"
    cfg = config(guards.address, faulty.address, str(db), content=content)
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = await asyncio.to_thread(start_orchestrator, cfg, env={"PROCMESH_API_KEYS": KEYS})
    return Stack(proc, db, tmp / "config.yaml")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    s = await _stack(
        start_sidecar, start_orchestrator, tmp_path_factory.mktemp("decisions"), "dec", content=False
    )
    yield s
    await s.http.aclose()


async def test_a_run_records_exactly_its_decisions_with_hashes_and_no_content(stack: Stack) -> None:
    result = await stack.generate("a", ADA, memory={"thread": "t1", "resource": "ada"})
    run_id = result["runId"]
    assert "darn" not in result["text"].lower()  # the word filter rewrote the stream
    response = await stack.http.get(f"/api/runs/{run_id}/decisions", headers=ADA)
    assert response.status_code == 200
    decisions = response.json()["decisions"]
    kinds = Counter((d["processor"], d["hook"], d["outcome"], d["would"]) for d in decisions)
    rewritten = kinds[("word-filter", "process_output_stream", "rewrite", "")]
    passed = kinds[("word-filter", "process_output_stream", "pass", "")]
    assert rewritten >= 1
    assert kinds == {
        ("raiser", "process_input_step", "failed_open", ""): 1,
        ("topic-guard", "process_input", "monitor", "abort"): 1,
        ("word-filter", "process_output_stream", "rewrite", ""): rewritten,
        ("word-filter", "process_output_stream", "pass", ""): passed,
    }
    parts = [d["part"] for d in decisions if d["hook"] == "process_output_stream"]
    assert parts == list(range(len(parts)))  # each stream part at its offset in the session
    assert all(d["part"] is None for d in decisions if d["hook"] != "process_output_stream")
    assert all(len(d["seen"]) == 64 and d["content"] is None for d in decisions)
    assert all(d["sidecar"] in ("guards", "faulty") and d["agentId"] == "a" for d in decisions)
    # the store itself holds no content: every content cell is NULL, and the input is nowhere
    assert stack.rows("SELECT count(*) FROM run_decisions WHERE content IS NOT NULL") == [(0,)]
    dump = "\n".join(str(r) for r in stack.rows("SELECT * FROM run_decisions"))
    assert "jailbreak" not in dump
    # an agent without recordInputs keeps no input for replay either
    assert stack.rows("SELECT count(*) FROM run_inputs WHERE run_id = ?", run_id) == [(0,)]


async def test_an_agent_recording_inputs_keeps_what_its_run_was_given(stack: Stack) -> None:
    """Item 2: the run's input, its request context, what memory made of its prompt, each step's
    raw model output and the tool results, in the store with the run, deleted with its thread."""
    result = (
        await stack.http.post(
            "/api/agents/rec/generate",
            json={
                "messages": "what is the weather in Paris?",
                "memory": {"thread": "t9", "resource": "ada"},
                "requestContext": {},
            },
            headers=ADA,
        )
    ).json()
    run_id = result["runId"]
    rows = stack.rows("SELECT kind, step, body FROM run_inputs WHERE run_id = ? ORDER BY id", run_id)
    kinds = [(kind, step) for kind, step, _ in rows]
    assert kinds == [
        ("input", 0),
        ("request-context", 0),
        ("memory-context", 0),
        ("model-prompt", 0),
        ("model-output", 0),
        ("tool-output", 0),
        ("model-prompt", 1),
        ("model-output", 1),
        ("tool-results", 0),
    ]
    bodies = {kind + str(step): json.loads(body) for kind, step, body in rows}
    assert "Paris" in json.dumps(bodies["input0"])
    assert any(c["type"] == "tool-call" for c in bodies["model-output0"])  # raw: before any processor
    assert bodies["tool-results0"][0]["result"] == {"celsius": 21, "forecast": "sunny"}
    assert len(bodies["model-prompt1"]["sha256"]) == 64  # what the model was shown, as a hash
    assert bodies["tool-output0"]["result"] == {"celsius": 21, "forecast": "sunny"}  # the tool's own
    # what memory made of the prompt (a new thread: no history, the input as given)
    assert [source for _, source in bodies["memory-context0"]["messages"]] == ["input"]
    deleted = await stack.http.delete(
        "/api/memory/threads/t9", params={"resourceId": "ada", "agentId": "rec"}, headers=ADA
    )
    assert deleted.status_code == 200, deleted.text
    assert stack.rows("SELECT count(*) FROM run_inputs WHERE run_id = ?", run_id) == [(0,)]


async def test_a_blocking_guard_records_its_abort(stack: Stack) -> None:
    result = await stack.generate("blocked", ADA, memory={"thread": "t2", "resource": "ada"})
    decisions = (await stack.http.get(f"/api/runs/{result['runId']}/decisions", headers=OPERATOR)).json()[
        "decisions"
    ]
    assert [(d["processor"], d["hook"], d["outcome"]) for d in decisions] == [
        ("topic-guard", "process_input", "abort")
    ]


async def test_another_tenant_is_refused_as_for_no_record(stack: Stack) -> None:
    result = await stack.generate("a", ADA, memory={"thread": "t3", "resource": "ada"})
    run_id = result["runId"]
    assert (await stack.http.get(f"/api/runs/{run_id}/decisions", headers=ADA)).status_code == 200
    refused = await stack.http.get(f"/api/runs/{run_id}/decisions", headers=BOB)
    none = await stack.http.get("/api/runs/no-such-run/decisions", headers=BOB)
    assert refused.status_code == none.status_code == 404
    assert "ada" not in refused.text


async def test_grpc_reads_a_runs_decisions_and_refuses_another_tenant(stack: Stack) -> None:
    result = await stack.generate("blocked", ADA, memory={"thread": "t6", "resource": "ada"})
    request = apb.GetRunDecisionsRequest(run_id=result["runId"])
    async with grpc.aio.insecure_channel(stack.proc.grpc_address) as channel:
        stub = agrpc.AgentServiceStub(channel)
        answer = await stub.GetRunDecisions(request, metadata=(("authorization", "Bearer ada-key"),))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetRunDecisions(request, metadata=(("authorization", "Bearer bob-key"),))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    (decision,) = answer.decisions
    assert (decision.processor, decision.outcome) == ("topic-guard", "abort")
    assert not decision.HasField("part")
    assert len(decision.seen) == 64
    assert not decision.HasField("content")


async def test_the_cli_prints_a_runs_decisions(stack: Stack) -> None:
    result = await stack.generate("blocked", OPERATOR)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PROCMESH_CONFIG_FILE": str(stack.config_path)}
    out = await asyncio.to_thread(
        subprocess.run,
        [str(bin_dir / "procmesh"), "runs", "decisions", result["runId"]],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    (line,) = out.stdout.splitlines()
    assert "process_input" in line
    assert "guards/topic-guard" in line
    assert "\tabort\t" in line
    as_json = await asyncio.to_thread(
        subprocess.run,
        [str(bin_dir / "procmesh"), "runs", "decisions", result["runId"], "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(as_json.stdout)["outcome"] == "abort"
    missing = await asyncio.to_thread(
        subprocess.run,
        [str(bin_dir / "procmesh"), "runs", "decisions", "no-such-run"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert missing.returncode == 1
    assert missing.stdout == ""  # an error is never read as output
    assert "no decision record of run 'no-such-run'" in missing.stderr
    for refused, said in [
        ([result["runId"], "--since", "2000-01-01"], "give a RUN or --since, not both"),
        # each printed the run's whole record before, the flag unread
        ([result["runId"], "--agent", "blocked"], "--agent go with --since, not with a RUN"),
        ([result["runId"], "--until", "2999-01-01", "--limit", "1"], "--until, --limit go with --since"),
        (["--since", "2000-01-01", "--limit", "0"], "--limit must be from 1 to 9999"),
        (["--since", "2000-01-01", "--limit", "10000"], "--limit must be from 1 to 9999"),
    ]:
        usage = await asyncio.to_thread(
            subprocess.run,
            [str(bin_dir / "procmesh"), "runs", "decisions", *refused],
            capture_output=True,
            text=True,
            env=env,
        )
        assert (usage.returncode, usage.stdout) == (2, ""), usage
        assert said in usage.stderr
    # by time: every run's decisions from a moment on, the run's id on each line
    by_time = await asyncio.to_thread(
        subprocess.run,
        [
            str(bin_dir / "procmesh"),
            "runs",
            "decisions",
            "--since",
            "2000-01-01",
            "--agent",
            "blocked",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = [json.loads(line) for line in by_time.stdout.splitlines()]
    assert result["runId"] in {d["runId"] for d in lines}
    assert {d["agentId"] for d in lines} == {"blocked"}
    later = await asyncio.to_thread(
        subprocess.run,
        [str(bin_dir / "procmesh"), "runs", "decisions", "--since", "2999-01-01", "--until", "3000-01-01"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert later.stdout == ""


async def test_decisions_by_time_over_http_are_an_operators_to_read(stack: Stack) -> None:
    result = await stack.generate("blocked", ADA, memory={"thread": "t7", "resource": "ada"})
    query = {"since": "2000-01-01T00:00:00Z", "agentId": "blocked"}
    response = await stack.http.get("/api/runs/decisions", params=query, headers=OPERATOR)
    assert response.status_code == 200, response.text
    decisions = response.json()["decisions"]
    assert result["runId"] in {d["runId"] for d in decisions}
    assert {d["agentId"] for d in decisions} == {"blocked"}
    assert [d["at"] for d in decisions] == sorted(d["at"] for d in decisions)  # oldest first
    later = {"since": "2999-01-01T00:00:00Z", "until": "3000-01-01T00:00:00Z"}
    assert (await stack.http.get("/api/runs/decisions", params=later, headers=OPERATOR)).json() == {
        "decisions": [],
        "hasMore": False,
    }
    tenant = await stack.http.get("/api/runs/decisions", params=query, headers=ADA)
    assert tenant.status_code == 403  # every tenant's decisions: not a tenant key's to read
    missing = await stack.http.get("/api/runs/decisions", params={"agentId": "blocked"}, headers=OPERATOR)
    assert missing.status_code == 400
    assert "since" in missing.text
    bad = await stack.http.get("/api/runs/decisions", params={"since": "yesterday"}, headers=OPERATOR)
    assert bad.status_code == 400


async def test_decisions_by_time_cut_at_the_limit_say_so(stack: Stack) -> None:
    """A read by time that stops at its limit says the range holds more (HTTP ``hasMore``, the
    CLI a line on stderr), never a first page passed off as the whole range."""
    for _ in range(2):
        await stack.generate("blocked", OPERATOR)
    query = {"since": "2000-01-01T00:00:00Z", "agentId": "blocked"}
    whole = (await stack.http.get("/api/runs/decisions", params=query, headers=OPERATOR)).json()
    assert len(whole["decisions"]) >= 2
    assert whole["hasMore"] is False
    cut = await stack.http.get("/api/runs/decisions", params={**query, "limit": 1}, headers=OPERATOR)
    assert cut.status_code == 200, cut.text
    assert cut.json() == {"decisions": whole["decisions"][:1], "hasMore": True}
    exact = {**query, "limit": len(whole["decisions"])}
    assert (await stack.http.get("/api/runs/decisions", params=exact, headers=OPERATOR)).json() == whole
    too_many = await stack.http.get(
        "/api/runs/decisions", params={**query, "limit": 10_000}, headers=OPERATOR
    )
    assert too_many.status_code == 400
    assert "limit: must be an integer from 1 to 9999" in too_many.text
    superscript = await stack.http.get(  # '²' is a digit to str.isdigit, not to int(): once a 500
        "/api/runs/decisions", params={**query, "limit": "\u00b2"}, headers=OPERATOR
    )
    assert superscript.status_code == 400, superscript.text
    procmesh = str(Path(sys.executable).parent / "procmesh")
    env = {**os.environ, "PROCMESH_CONFIG_FILE": str(stack.config_path)}
    command = [procmesh, "runs", "decisions", "--since", "2000-01-01", "--agent", "blocked", "--json"]
    out = await asyncio.to_thread(
        subprocess.run, [*command, "--limit", "1"], capture_output=True, text=True, env=env, check=True
    )
    assert len(out.stdout.splitlines()) == 1
    assert "the range holds more than --limit 1 decisions" in out.stderr
    out = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, env=env, check=True
    )
    assert len(out.stdout.splitlines()) == len(whole["decisions"])
    assert out.stderr == ""


async def test_retention_and_thread_deletion_purge_records(stack: Stack) -> None:
    result = await stack.generate("a", ADA, memory={"thread": "t4", "resource": "ada"})
    run_id = result["runId"]
    assert stack.rows("SELECT count(*) FROM run_decisions WHERE run_id = ?", run_id)[0][0] > 0
    # age the run's record past the one-day retention: the next run's write purges it
    stack.rows("UPDATE run_decisions SET at = '2000-01-01T00:00:00.000000Z' WHERE run_id = ?", run_id)
    await stack.generate("blocked", OPERATOR)
    assert stack.rows("SELECT count(*) FROM run_decisions WHERE run_id = ?", run_id) == [(0,)]
    # deleting a thread deletes its runs' records
    kept = await stack.generate("a", ADA, memory={"thread": "t5", "resource": "ada"})
    assert (await stack.http.get(f"/api/runs/{kept['runId']}/decisions", headers=ADA)).status_code == 200
    deleted = await stack.http.delete(
        "/api/memory/threads/t5", params={"resourceId": "ada", "agentId": "a"}, headers=ADA
    )
    assert deleted.status_code == 200, deleted.text
    assert (await stack.http.get(f"/api/runs/{kept['runId']}/decisions", headers=ADA)).status_code == 404


async def test_content_recording_keeps_what_each_processor_saw(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    s = await _stack(
        start_sidecar, start_orchestrator, tmp_path_factory.mktemp("content"), "cont", content=True
    )
    try:
        result = await s.generate("blocked", OPERATOR)
        (decision,) = (await s.http.get(f"/api/runs/{result['runId']}/decisions", headers=OPERATOR)).json()[
            "decisions"
        ]
        assert decision["outcome"] == "abort"
        assert TEXT in decision["content"]
        assert "run_id" not in decision["content"]  # the run context is not what it judged
    finally:
        await s.http.aclose()
