"""What test_replay.py records and replays: the recorded config (real sidecars, the demo model) and
the candidate (a blocking guard added, an option changed), the 50 inputs, the `Stack` of the two
orchestrators with the calls the tests make on it (generate, decisions, `procmesh replay` as a
process or in this process), and the steps whose decisions differ between two runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import io
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from procmesh_orchestrator.cli import replay as replay_cli
from procmesh_orchestrator.errors import OrchestratorError
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.decision_support import DEMO_AGENT, OPERATOR, WEATHER_TOOL, jailbreak_guard

KEYS = "op-key=@operator,ada-key=ada"
RUNS = 50
HATE = {"category_scores": [{"category": "hate", "score": 0.9}], "reason": "hateful"}
PROCMESH = str(Path(sys.executable).parent / "procmesh")


def recorded_config(guards: str, adder: str, db: str) -> dict[str, Any]:
    return {
        "sidecars": {"guards": {"address": guards}, "adder": {"address": adder}},
        "models": {"demo": {"provider": "demo"}},
        "storage": {"path": db},
        "decisions": {"record": True},
        "tools": {"weather": WEATHER_TOOL},
        "agents": {
            "rec": {
                **DEMO_AGENT,
                "tools": ["weather"],
                "recordInputs": True,
                "inputProcessors": [jailbreak_guard()],
                "outputProcessors": [{"processor": "guards/word-filter", "options": {"words": ["zebra"]}}],
            },
            "mem": {
                **DEMO_AGENT,
                "recordInputs": True,
                "memory": {"lastMessages": 10},
                "inputProcessors": [jailbreak_guard()],
            },
            "notes": {  # memory with working memory: a system message and updateWorkingMemory
                **DEMO_AGENT,
                "recordInputs": True,
                "memory": {"lastMessages": 10, "workingMemory": {"template": "# Notes\n- fruit:"}},
                "inputProcessors": [jailbreak_guard()],
            },
            "budgeted": {  # a token budget the third turn's tool result outgrows at step 1
                **DEMO_AGENT,
                "tools": ["weather"],
                "recordInputs": True,
                "memory": {"lastMessages": 10, "messageHistory": {"maxTokens": 140, "atMaxRemoveTokens": 0}},
            },
            "adder": {
                **DEMO_AGENT,
                "recordInputs": True,
                "inputProcessors": [{"processor": "adder/weather-adder"}],
            },
            "norec": {
                **DEMO_AGENT,
                "inputProcessors": [jailbreak_guard()],
            },
        },
    }


def candidate_of(recorded: dict[str, Any]) -> dict[str, Any]:
    """A blocking guard added, an option changed (the word filter masks one word more)."""
    cfg = copy.deepcopy(recorded)
    agent = cfg["agents"]["rec"]
    guard = {
        "processor": "guards/topic-guard",
        "name": "forbidden-guard",
        "options": {"words": ["forbidden"]},
    }
    agent["inputProcessors"].append(guard)
    agent["outputProcessors"][0]["options"]["words"] = ["zebra", "banana"]
    return cfg


def text_of(i: int) -> str:
    words = [f"hello number {i}"]
    if i % 7 == 3:
        words.append("what is the weather")  # a tool call, then a second step
    if i % 4 == 1:
        words.append("banana")  # echoed by the model: the changed option masks it
    if i % 6 == 4:
        words.append("zebra")  # masked either way
    if i % 5 == 0:
        words.append("forbidden")  # the candidate's new guard blocks it
    if i % 9 == 2:
        words.append("jailbreak")  # blocked either way
    return " ".join(words)


@dataclass
class Stack:
    recorded: OrchestratorProcess
    live: OrchestratorProcess
    http: httpx.AsyncClient
    recorded_path: Path
    candidate_path: Path
    candidate: dict[str, Any]
    run_ids: list[str]
    live_ids: list[str]
    since: str
    until: str
    env: dict[str, str]

    async def generate(self, proc: OrchestratorProcess, text: str, agent: str = "rec", **body: Any) -> str:
        response = await self.http.post(
            f"{proc.http_url}/api/agents/{agent}/generate", json={"messages": text, **body}, headers=OPERATOR
        )
        assert response.status_code == 200, response.text
        return str(response.json()["runId"])

    async def decisions(self, proc: OrchestratorProcess, run_id: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"{proc.http_url}/api/runs/{run_id}/decisions", headers=OPERATOR)
        assert response.status_code == 200, response.text
        return list(response.json()["decisions"])

    async def replay(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`procmesh replay ARGS` as a process (its exit code as CI sees it)."""
        return await asyncio.to_thread(
            subprocess.run, [PROCMESH, "replay", *args], capture_output=True, text=True, env=self.env
        )

    async def replay_here(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The same command's code run in this process (a process start costs seconds on loaded
        cores): its exit code, what it printed, and an error's message as `main` prints it."""
        parser = argparse.ArgumentParser()
        replay_cli.add_parser(parser.add_subparsers())
        parsed = parser.parse_args(["replay", *args, "--store-config", str(self.recorded_path)])
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                code, err = await replay_cli.run(parsed), ""
        except OrchestratorError as exc:  # main's exit code for one
            code, err = 2, f"procmesh: error: {exc}"
        return subprocess.CompletedProcess(args, code, out.getvalue(), err)


async def each_run(make: Callable[[int], Any]) -> list[Any]:
    """`make(i)` for each of the RUNS inputs, all at once."""
    return await asyncio.gather(*(make(i) for i in range(RUNS)))


def changed_steps(recorded: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> set[int]:
    """The steps where the two runs' decisions differ (by where each was made and its outcome): a
    pass that only one run made did nothing, so only the rest is compared."""

    def at(decisions: list[dict[str, Any]], step: int) -> Counter[tuple[Any, ...]]:
        return Counter(
            (d["entry"], d["processor"], d["hook"], d["part"], d["outcome"], d["would"])
            for d in decisions
            if d["step"] == step and d["outcome"] != "pass"
        )

    steps = {d["step"] for d in recorded + candidate}
    return {step for step in steps if at(recorded, step) != at(candidate, step)}
