"""The optimistic first step (`optimisticFirstStep`) with input processors in real sidecar processes.

The model is a test double that answers ``echo: <the last user text>`` and records when each
call starts, what it was asked and whether it was cancelled; the input processors are a slow
speculative one, the scripted rewriter and gate, and the (non-speculative) recorder last.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RECORDER = "tests.e2e.speculation.recorder"
PROCESSORS = [
    {
        "id": "rw",
        "speculative": True,
        "processInput": [
            {"when": {"textContains": "apple"}, "do": [{"replaceText": {"pattern": "apple", "with": "pear"}}]}
        ],
    },
    {
        "id": "gate",
        "speculative": True,
        "processInput": [{"when": {"textContains": "forbidden"}, "do": [{"abort": {"reason": "blocked"}}]}],
    },
]


@pytest.fixture(scope="module")
def sidecars(start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path) -> dict[str, SidecarProcess]:
    scenario = sidecar_dir / "processors.json"
    scenario.write_text(json.dumps({"agent": {"inputProcessors": PROCESSORS}}))
    return {
        "s": start_sidecar("scripted", "--scenario", str(scenario), name="scripted"),
        "rec": start_sidecar(name="recorder", module=RECORDER),
    }


def last_user_text(request: ModelRequest) -> str:
    user = [m for m in request.prompt if m["role"] == "user"][-1]
    return " ".join(p["text"] for p in user["content"] if p.get("type") == "text")


def recorded(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class EchoModel:
    """Echoes the last user text; records each call: its text, what the recorder had seen by its
    start, and how it ended (answered, cancelled)."""

    model_id = "echo"

    def __init__(self, log: Path, *, first_chunk_after: float = 0.0) -> None:
        self.log = log
        self.first_chunk_after = first_chunk_after
        self.calls: list[dict[str, Any]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        call: dict[str, Any] = {
            "text": last_user_text(request),
            "recorder_had_run": bool(recorded(self.log)),
            "ended": "running",
        }
        self.calls.append(call)
        try:
            await asyncio.sleep(self.first_chunk_after)
            yield {"type": "text-delta", "payload": {"id": "t0", "text": f"echo: {call['text']}"}}
            usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
            yield {"type": "finish", "payload": {"finishReason": "stop", "usage": usage}}
            call["ended"] = "answered"
        except (asyncio.CancelledError, GeneratorExit):
            call["ended"] = "cancelled"
            raise


def config(sidecars: dict[str, SidecarProcess], log: Path, lane: list[str], *, optimistic: bool) -> Any:
    refs: dict[str, Any] = {
        "slow": {"processor": "rec/slow", "options": {"log": str(log.with_suffix(".slow")), "delay": 0.3}},
        "recorder": {"processor": "rec/recorder", "options": {"log": str(log)}},
        "rw": {"processor": "s/rw"},
        "gate": {"processor": "s/gate"},
    }
    return parse_config(
        {
            "sidecars": {name: {"address": proc.address} for name, proc in sidecars.items()},
            "models": {"scripted": {"provider": "scripted", "responses": []}},
            "agents": {
                "a": {
                    "model": "scripted",
                    "errorProcessorDefaults": False,
                    "optimisticFirstStep": optimistic,
                    "inputProcessors": [refs[p] for p in lane],
                }
            },
        },
        "test config",
    )


async def run_stream(app: App, model: EchoModel, text: str, log: Path) -> tuple[list[dict[str, Any]], Any]:
    """Stream a run; each text chunk notes whether the recorder (the last input hook) had run."""
    app.agents["a"].spec.model = model
    stream = app.agent("a").stream(text)
    chunks = []
    async for chunk in stream:
        if chunk["type"] == "text-delta":
            chunk = {**chunk, "recorder_had_run": bool(recorded(log))}
        chunks.append(chunk)
    return chunks, await stream.result()


async def test_the_first_call_starts_early_and_shows_after_the_input_processors(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "rec.jsonl"
    model = EchoModel(log)
    async with App(config(ready, log, ["slow", "recorder"], optimistic=True)) as app:
        chunks, result = await run_stream(app, model, "hello", log)
    assert result.text == "echo: hello"
    # one call, made before the slow processor let the recorder run, and used as it was
    assert model.calls == [{"text": "hello", "recorder_had_run": False, "ended": "answered"}]
    deltas = [c for c in chunks if c["type"] == "text-delta"]
    assert [d["recorder_had_run"] for d in deltas] == [True]  # nothing reached the client early


async def test_without_the_option_the_call_waits_for_the_input_processors(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "rec.jsonl"
    model = EchoModel(log)
    async with App(config(ready, log, ["slow", "recorder"], optimistic=False)) as app:
        _, result = await run_stream(app, model, "hello", log)
    assert result.text == "echo: hello"
    assert model.calls == [{"text": "hello", "recorder_had_run": True, "ended": "answered"}]


async def test_a_rewrite_cancels_and_restarts_the_call_on_the_committed_input(
    ready: dict[str, SidecarProcess], tmp_path: Path
) -> None:
    log = tmp_path / "rec.jsonl"
    model = EchoModel(log, first_chunk_after=1.0)
    async with App(config(ready, log, ["slow", "rw", "recorder"], optimistic=True)) as app:
        chunks, result = await run_stream(app, model, "an apple", log)
    assert result.text == "echo: an pear"
    assert [(c["text"], c["ended"]) for c in model.calls] == [
        ("an apple", "cancelled"),
        ("an pear", "answered"),
    ]
    assert not any("apple" in json.dumps(c) for c in chunks)  # nothing of the first call reached the client


async def test_a_block_cancels_the_call(ready: dict[str, SidecarProcess], tmp_path: Path) -> None:
    log = tmp_path / "rec.jsonl"
    model = EchoModel(log, first_chunk_after=1.0)
    async with App(config(ready, log, ["slow", "gate", "recorder"], optimistic=True)) as app:
        chunks, result = await run_stream(app, model, "forbidden words", log)
    assert result.tripwire is not None
    assert result.tripwire["reason"] == "blocked"
    assert [(c["text"], c["ended"]) for c in model.calls] == [("forbidden words", "cancelled")]
    assert not any(c["type"] == "text-delta" for c in chunks)
