"""Replay (issue 31 items 3 and 4) through real processes: 50 runs recorded by a real
`procmesh-orchestrator` with real sidecar processes and the demo model (deterministic: its answer
follows the prompt), then replayed by `procmesh replay` against a candidate that adds a blocking
guard and changes an option. The diff names exactly the runs and steps whose decisions change, as
running the candidate live on the same 50 inputs shows; the unchanged config changes nothing. A
candidate that shows the model another prompt stops the run at that step, said so. Replay jobs
over HTTP give the same report; bad input is refused naming what.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import http.server
import json
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from procmesh_orchestrator.run import violation_routes
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.decision_support import ADA, OPERATOR
from tests.e2e.service.replay_stack import (
    HATE,
    KEYS,
    RUNS,
    Stack,
    candidate_of,
    changed_steps,
    each_run,
    recorded_config,
    text_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("replay")
    guards = start_sidecar("examples", name="replay-guards")
    adder = start_sidecar(name="replay-adder", module="tests.fixtures.adder_sidecar")
    await asyncio.gather(guards.wait_ready(), adder.wait_ready())
    recorded = recorded_config(guards.address, adder.address, str(tmp / "recorded.db"))
    candidate = candidate_of(recorded)
    live_cfg = {**copy.deepcopy(candidate), "storage": {"path": str(tmp / "live.db")}}
    env = {"PROCMESH_API_KEYS": KEYS}
    procs = await asyncio.gather(
        asyncio.to_thread(start_orchestrator, recorded, env=env),
        asyncio.to_thread(start_orchestrator, live_cfg, env=env),
    )
    paths = tmp / "recorded.yaml", tmp / "candidate.yaml"
    for path, cfg in zip(paths, (recorded, candidate), strict=True):
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    async with httpx.AsyncClient(timeout=60) as http:
        s = Stack(*procs, http, *paths, candidate, [], [], "", "", {})
        s.since = datetime.now(UTC).isoformat()
        s.run_ids = await each_run(lambda i: s.generate(s.recorded, text_of(i)))
        s.until = datetime.now(UTC).isoformat()
        s.live_ids = await each_run(lambda i: s.generate(s.live, text_of(i)))
        s.env = {**os.environ, "PROCMESH_CONFIG_FILE": str(s.recorded_path)}
        yield s


async def test_replay_names_exactly_the_runs_and_steps_a_live_candidate_changes(stack: Stack) -> None:
    recorded = await each_run(lambda i: stack.decisions(stack.recorded, stack.run_ids[i]))
    live = await each_run(lambda i: stack.decisions(stack.live, stack.live_ids[i]))
    expected = {(stack.run_ids[i], step) for i in range(RUNS) for step in changed_steps(recorded[i], live[i])}
    started = time.perf_counter()
    out = await stack.replay(
        "--config", str(stack.candidate_path), "--agent", "rec", "--since", stack.since,
        "--until", stack.until, "--json",
    )  # fmt: skip
    took = time.perf_counter() - started
    assert out.returncode == 3, out.stderr
    report = json.loads(out.stdout)
    assert sorted(r["runId"] for r in report["runs"]) == sorted(stack.run_ids)  # every recorded run
    found = {(r["runId"], c["step"]) for r in report["runs"] for c in r["changes"]}
    assert found == expected
    assert all(r["stopped"] is None for r in report["runs"])
    # both kinds of change are there: the new guard's blocks and the changed option's masks
    blocked = {stack.run_ids[i] for i in range(RUNS) if i % 5 == 0 and i % 9 != 2}
    masked = {
        stack.run_ids[i] for i in range(RUNS) if i % 4 == 1 and i % 6 != 4 and i % 7 != 3 and i % 9 != 2
    }
    masked -= blocked
    changed = set(report["summary"]["changed"])
    assert blocked
    assert masked
    assert changed == blocked | masked
    processors = report["summary"]["processors"]
    assert processors["guards/topic-guard"]["block"] == sum(
        1 for i in range(RUNS) if i % 5 == 0 or i % 9 == 2
    )
    assert processors["guards/word-filter"]["mask"] > 0
    print(f"\nreplayed {RUNS} runs in {took:.2f} s (the procmesh process's start included)")


async def test_replaying_the_unchanged_config_changes_nothing(stack: Stack) -> None:
    out = await stack.replay(
        "--config", str(stack.recorded_path), "--agent", "rec", "--since", stack.since,
        "--until", stack.until, "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["summary"]["runs"] == report["summary"]["replayed"] == RUNS
    assert report["summary"]["changed"] == []
    assert all(r["changes"] == [] and not r["changed"] for r in report["runs"])
    text = await stack.replay_here(stack.run_ids[1], "--config", str(stack.recorded_path))
    assert text.returncode == 0
    assert f"run {stack.run_ids[1]}: no change" in text.stdout


async def test_tools_are_answered_from_the_record(stack: Stack, tmp_path: Path) -> None:
    """A candidate whose weather tool would answer otherwise: the recorded result is what the model
    is shown (the step after the call sees the recorded prompt), so nothing changes."""
    cfg = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))
    cfg["tools"]["weather"]["result"] = {"celsius": -40, "forecast": "blizzard"}
    path = tmp_path / "other-tool.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    weather_run = stack.run_ids[3]  # asks for the weather: a tool call at step 0, an answer at step 1
    out = await stack.replay_here(weather_run, "--config", str(path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert run == {
        "runId": weather_run, "agentId": "rec", "changed": False, "changes": [], "stopped": None,
        "notReplayable": None,
    }  # fmt: skip


async def test_a_candidate_showing_the_model_another_prompt_stops_the_run_there(
    stack: Stack, tmp_path: Path
) -> None:
    run_id = await stack.generate(stack.recorded, "mail me at ada@example.com about the weather")
    cfg = copy.deepcopy(stack.candidate)
    cfg["agents"]["rec"]["inputProcessors"].insert(0, {"processor": "guards/pii-redactor"})
    path = tmp_path / "redacting.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    out = await stack.replay_here(run_id, "--config", str(path), "--json")
    assert out.returncode == 3, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert run["stopped"]["step"] == 0
    assert "recorded model output no longer applies from step 0" in run["stopped"]["reason"]
    # what the candidate decided before it stopped is compared: the redactor's rewrite is the change
    assert [(c["step"], c["processor"], c["recorded"], c["candidate"]) for c in run["changes"]] == [
        (0, "guards/pii-redactor", None, "rewrite")
    ]
    text = await stack.replay_here(run_id, "--config", str(path))
    assert "stopped at step 0: recorded model output no longer applies from step 0" in text.stdout


async def test_bad_input_is_an_error_naming_it(stack: Stack) -> None:
    unknown = await stack.replay("no-such-run", "--config", str(stack.recorded_path))
    assert unknown.returncode == 2
    assert "no-such-run" in unknown.stderr
    run_id = await stack.generate(stack.recorded, "hello", agent="norec")
    unrecorded = await stack.replay_here(run_id, "--config", str(stack.recorded_path))
    assert unrecorded.returncode == 2
    assert f"run {run_id!r} is not replayable: no recorded inputs" in unrecorded.stderr
    # in a time range such a run is listed, not skipped (and changes nothing)
    ranged = await stack.replay_here(
        "--agent", "norec", "--since", stack.since, "--config", str(stack.recorded_path)
    )
    assert ranged.returncode == 0, ranged.stderr
    assert f"run {run_id}: not replayable: no recorded inputs" in ranged.stdout
    assert (
        "0 of 1 runs replayed; 0 changed, 0 stopped, 1 not replayable (no recorded inputs)" in ranged.stdout
    )
    both = await stack.replay_here(run_id, "--agent", "rec", "--config", str(stack.recorded_path))
    assert both.returncode == 2
    assert "not both" in both.stderr


async def test_a_replay_job_over_http(stack: Stack) -> None:
    url = f"{stack.recorded.http_url}/api/replays"
    body = {"runId": stack.run_ids[0], "config": stack.candidate_path.read_text(encoding="utf-8")}
    refused = await stack.http.post(url, json=body, headers=ADA)
    assert refused.status_code == 403
    unknown_key = await stack.http.post(url, json={**body, "dryRun": True}, headers=OPERATOR)
    assert unknown_key.status_code == 400
    assert "dryRun" in unknown_key.text
    twice = await stack.http.post(url, json={**body, "config": "agents: {}\nagents: {}\n"}, headers=OPERATOR)
    assert twice.status_code == 400
    assert "duplicate key 'agents'" in twice.text
    bad_candidate = await stack.http.post(url, json={**body, "config": {"bogus": 1}}, headers=OPERATOR)
    assert bad_candidate.status_code == 400
    assert "bogus" in bad_candidate.text
    started = await stack.http.post(url, json=body, headers=OPERATOR)
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    job = await _finished(stack, f"{url}/{job_id}")
    assert job["status"] == "done", job
    cli = await stack.replay_here(stack.run_ids[0], "--config", str(stack.candidate_path), "--json")
    as_cli = json.loads(cli.stdout)
    assert job["result"]["runs"] == as_cli["runs"]
    assert job["result"]["changed"] is True  # run 0 says "forbidden": the new guard blocks it
    # the candidate as JSON, and a run the store does not know: the job fails naming it
    missing = await stack.http.post(
        url, json={"runId": "no-such-run", "config": stack.candidate}, headers=OPERATOR
    )
    assert missing.status_code == 202
    failed = await _finished(stack, f"{url}/{missing.json()['id']}")
    assert failed["status"] == "failed"
    assert "no-such-run" in failed["error"]
    gone = await stack.http.get(f"{url}/no-such-job", headers=OPERATOR)
    assert gone.status_code == 404
    # an agent's runs in a time range, as `procmesh replay --agent --since --until` replays them
    ranged = {"agentId": "rec", "since": stack.since, "until": stack.until, "config": stack.candidate}
    started = await stack.http.post(url, json=ranged, headers=OPERATOR)
    assert started.status_code == 202, started.text
    job = await _finished(stack, f"{url}/{started.json()['id']}")
    assert job["status"] == "done", job
    assert job["result"]["summary"]["replayed"] == RUNS
    assert job["result"]["changed"] is True
    half = await stack.http.post(url, json={"agentId": "rec", "config": stack.candidate}, headers=OPERATOR)
    assert half.status_code == 400
    assert "since and until" in half.text


async def _finished(stack: Stack, url: str) -> dict[str, Any]:
    for _ in range(600):
        job = (await stack.http.get(url, headers=OPERATOR)).json()
        if job["status"] != "running":
            return dict(job)
        await asyncio.sleep(0.05)
    raise AssertionError(f"replay job not finished: {job}")


async def test_a_retry_the_candidate_asks_for_stops_the_run_at_its_step(stack: Stack, tmp_path: Path) -> None:
    """A length check asking for a shorter answer: the retry calls the model again, which the
    recorded run never did, so the run stops at step 0; the retry is counted and compared."""
    cfg = copy.deepcopy(stack.candidate)
    check = {"processor": "guards/length-check", "options": {"max_words": 3}}
    cfg["agents"]["rec"]["outputProcessors"].append(check)
    cfg["agents"]["rec"]["maxProcessorRetries"] = 1
    path = tmp_path / "length.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    plain_run = stack.run_ids[6]  # neither blocked nor asking for a tool
    out = await stack.replay_here(plain_run, "--config", str(path), "--json")
    assert out.returncode == 3, out.stderr
    report = json.loads(out.stdout)
    (run,) = report["runs"]
    assert run["stopped"]["step"] == 0
    assert run["stopped"]["reason"] == "the recorded run made no model call 2: nothing answers it"
    assert (0, "guards/length-check", None, "retry") in {
        (c["step"], c["processor"], c["recorded"], c["candidate"]) for c in run["changes"]
    }
    assert report["summary"]["processors"]["guards/length-check"]["retry"] == 1


async def test_the_same_config_with_a_lane_changed_by_set(stack: Stack) -> None:
    lane = "agents.rec.inputProcessors=[{processor: guards/topic-guard, options: {words: [hello]}}]"
    plain_run = stack.run_ids[6]
    out = await stack.replay_here(plain_run, "--config", str(stack.recorded_path), "--set", lane, "--json")
    assert out.returncode == 3, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert run["changes"] == [
        {
            "step": 0, "entry": "topic-guard", "processor": "guards/topic-guard", "hook": "process_input",
            "part": None, "recorded": "pass", "candidate": "abort",
        }
    ]  # fmt: skip
    bad = await stack.replay_here(plain_run, "--config", str(stack.recorded_path), "--set", "agents.rec")
    assert bad.returncode == 2
    assert "--set 'agents.rec': give KEY=VALUE" in bad.stderr


def thread_rows(stack: Stack, thread: str) -> list[tuple[Any, ...]]:
    """The thread and its messages as the recorded store's file holds them."""
    db = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))["storage"]["path"]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        threads = conn.execute("SELECT * FROM threads WHERE thread_id = ?", (thread,)).fetchall()
        messages = conn.execute("SELECT * FROM messages WHERE thread_id = ?", (thread,)).fetchall()
    return [*threads, *messages]


async def test_a_run_with_memory_replays_what_memory_gave_its_prompt(stack: Stack, tmp_path: Path) -> None:
    """Three turns of one thread (lastMessages, working memory): the third's prompt held the first
    two, the working memory's instruction and its tool, which its record kept, so the unchanged
    config replays it without a stop and no change; a guard blocking
    a word of the first turn blocks it (the candidate's processors see the recorded history); the
    thread in the store is as the three turns left it."""
    memory = {"thread": "three-turns", "resource": "ada"}
    texts = ["hello, my fruit is apricot", "hello again", "which fruit did I name"]
    runs = [await stack.generate(stack.recorded, text, agent="notes", memory=memory) for text in texts]
    before = thread_rows(stack, "three-turns")
    assert len(before) == 1 + 2 * len(texts)  # the thread, a question and an answer per turn
    unchanged = await stack.replay_here(runs[2], "--config", str(stack.recorded_path), "--json")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    (run,) = json.loads(unchanged.stdout)["runs"]
    assert (run["stopped"], run["changes"], run["changed"]) == (None, [], False)
    cfg = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))
    guard = {"processor": "guards/topic-guard", "name": "fruit-guard", "options": {"words": ["apricot"]}}
    cfg["agents"]["notes"]["inputProcessors"].append(guard)
    path = tmp_path / "fruit-guard.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    blocked = await stack.replay_here(runs[2], "--config", str(path), "--json")
    assert blocked.returncode == 3, blocked.stderr
    (run,) = json.loads(blocked.stdout)["runs"]
    assert run["stopped"] is None
    assert [(c["step"], c["entry"], c["hook"], c["recorded"], c["candidate"]) for c in run["changes"]] == [
        (0, "fruit-guard", "process_input", None, "abort")
    ]
    assert thread_rows(stack, "three-turns") == before  # a replay writes no thread


async def test_a_token_budget_trims_the_replayed_history_as_it_trimmed_the_recorded(stack: Stack) -> None:
    """The third turn loads both earlier turns, asks for the weather, and its tool result makes the
    prompt outgrow the budget at step 1, where memory trimmed the oldest history (the thread's
    boundary moved): the replay trims it alike from the recorded budget, so nothing stops."""
    memory = {"thread": "budgeted-turns", "resource": "ada"}
    texts = ["hello, my fruit is apricot", "hello again", "what is the weather"]
    runs = [await stack.generate(stack.recorded, text, agent="budgeted", memory=memory) for text in texts]
    db = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))["storage"]["path"]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (body,) = conn.execute(
            "SELECT body FROM run_inputs WHERE run_id = ? AND kind = 'memory-context'", (runs[2],)
        ).fetchone()
        (metadata,) = conn.execute(
            "SELECT metadata FROM threads WHERE thread_id = 'budgeted-turns'"
        ).fetchone()
    context = json.loads(body)
    assert [s for _, s in context["messages"]].count("memory") == 4  # all history loaded at step 0
    assert context["budget"] == {"maxTokens": 140, "atMaxRemoveTokens": 0}
    assert "memoryTokenLimiter" in json.loads(metadata)  # trimmed later, at step 1
    before = thread_rows(stack, "budgeted-turns")
    out = await stack.replay_here(runs[2], "--config", str(stack.recorded_path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert (run["stopped"], run["changes"]) == (None, [])
    assert thread_rows(stack, "budgeted-turns") == before  # the boundary is not moved again


async def test_a_run_recorded_without_its_memory_stops_saying_so(stack: Stack) -> None:
    """A recording that kept no memory-context (as one made before memory was recorded): the
    thread's first run replays unchanged (nothing was loaded), the second stops at step 0 naming
    the reason."""
    memory = {"thread": "replayed-thread", "resource": "ada"}
    first = await stack.generate(stack.recorded, "hello there", agent="mem", memory=memory)
    second = await stack.generate(stack.recorded, "hello again", agent="mem", memory=memory)
    db = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))["storage"]["path"]
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "DELETE FROM run_inputs WHERE kind = 'memory-context' AND run_id IN (?, ?)", (first, second)
        )
    unchanged = await stack.replay_here(first, "--config", str(stack.recorded_path), "--json")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    out = await stack.replay_here(second, "--config", str(stack.recorded_path), "--json")
    assert out.returncode == 3, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert run["stopped"]["step"] == 0
    assert "memory thread, whose history its prompt held, is not replayed" in run["stopped"]["reason"]


async def test_a_replay_posts_no_violation_webhook(stack: Stack) -> None:
    """The candidate's onViolation webhook is a side effect of live traffic, not of a replay: the
    blocked run's violation goes nowhere (the posts in flight in this process are awaited)."""
    posted: list[bytes] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/violations"
        lane = (
            "agents.rec.inputProcessors=[{processor: guards/topic-guard, options: {words: [hello]}, "
            f"onViolation: {{webhook: '{url}'}}}}]"
        )
        out = await stack.replay_here(stack.run_ids[6], "--config", str(stack.recorded_path), "--set", lane)
        assert out.returncode == 3, out.stderr
        assert "pass -> abort" in out.stdout
        await violation_routes.flush()
        assert posted == []
    finally:
        server.shutdown()
        server.server_close()


async def test_a_tool_a_processor_adds_and_runs_is_answered_from_the_record(stack: Stack) -> None:
    """The adder's tool counts its calls: run again, it would answer otherwise and the next step's
    prompt would differ. The replay answers the call from the record, so nothing changes."""
    run_id = await stack.generate(stack.recorded, "what is the weather", agent="adder")
    out = await stack.replay_here(run_id, "--config", str(stack.recorded_path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert (run["changed"], run["stopped"]) == (False, None)


async def test_a_judging_guard_the_candidate_adds_judges_through_its_gateway(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The candidate adds the built-in moderation guard: the sidecar the replay starts judges
    through the candidate's model gateway, so the scripted judge (a real server) is asked for real,
    blocks the runs whose text it flags, and the summary counts exactly the calls it answered."""
    judge = JudgeServer(api_key="sk-judge-of-the-replay")
    judge.start()
    try:
        judge.judge("mod", {"category_scores": [], "reason": None}, Rule(("banana",), HATE))
        monkeypatch.setenv("JUDGE_KEY", "sk-judge-of-the-replay")  # the replay's own, never its sidecar's
        cfg = yaml.safe_load(stack.recorded_path.read_text(encoding="utf-8"))
        cfg["providers"] = {"judges": {"kind": "openai", "baseUrl": judge.base_url, "apiKeyEnv": "JUDGE_KEY"}}
        moderation = {
            "processor": "builtins/moderation",
            "options": {"model": "judges/mod", "categories": ["hate"]},
        }
        cfg["agents"]["rec"]["inputProcessors"].append(moderation)
        path = tmp_path / "moderated.yaml"
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        out = await stack.replay_here(
            "--config", str(path), "--agent", "rec", "--since", stack.since, "--until", stack.until, "--json"
        )
        assert out.returncode == 3, out.stdout + out.stderr
        summary = json.loads(out.stdout)["summary"]
        # the topic guard before it blocks the jailbreaks: every other run is judged, the bananas flagged
        flagged = {stack.run_ids[i] for i in range(RUNS) if "banana" in text_of(i) and i % 9 != 2}
        assert flagged
        assert set(summary["changed"]) == flagged
        assert summary["processors"]["builtins/moderation"]["block"] == len(flagged)
        judged = summary["judgeCalls"]
        assert judged["total"] == len(judge.calls("mod")) >= RUNS - sum(1 for i in range(RUNS) if i % 9 == 2)
        assert sum(judged["processors"].values()) == judged["total"]
        asked = len(judge.calls("mod"))
        (run_id,) = sorted(flagged)[:1]
        text = await stack.replay_here(run_id, "--config", str(path))
        assert text.returncode == 3, text.stdout + text.stderr
        (name,) = judged["processors"]
        assert f"judge calls: 1 ({name} 1)" in text.stdout
        assert len(judge.calls("mod")) == asked + 1
    finally:
        judge.stop()
