"""Background tool calls (SEED-GAPS L4): a real tool sidecar (`tests.fixtures.background_sidecar`)
and the builtins' ``background-work-signals`` processor, over gRPC, under a real App on a SQLite
store. The test decides when background work lands (a gate file the tool waits for), no clock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.run import CallOptions, RunResult, background
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.tools.harness import Chunk, call, config, of_type, prompts, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

STARTED = "Background task started. Task ID: "
OPTIONS = CallOptions(thread_id="t1", resource_id="r1")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecars(start_sidecar: Callable[..., SidecarProcess]) -> dict[str, str]:
    tools = start_sidecar(name="bg", module="tests.fixtures.background_sidecar")
    signals = start_sidecar("background-work-signals", name="bi")
    await tools.wait_ready()
    await signals.wait_ready()
    return {"bg": tools.address, "bi": signals.address}


def bg_config(
    sidecars: dict[str, str],
    store: Path,
    responses: list[dict[str, Any]],
    tools: dict[str, Any],
    **lanes: Any,
) -> Config:
    """Agent ``a`` with the tools, on the store; background-work-signals in the input lane (the
    seeds' place) unless `lanes` say otherwise."""
    return config(
        sidecars={name: {"address": address, "timeout": 10} for name, address in sidecars.items()},
        tools={"hold": {"sidecar": "bg"}, **tools},
        responses=responses,
        memory={},
        top={"storage": {"path": str(store)}},
        **(lanes or {"inputProcessors": ["bi/background-work-signals"]}),
    )


async def run(
    app: App, text: str, opened: Callable[[Chunk], Path | None] = lambda c: None
) -> tuple[list[Chunk], RunResult]:
    """Stream a run; `opened` sees each chunk and names a gate to open on it, if any."""
    stream = app.agent("a").stream(text, OPTIONS)
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        gate = opened(chunk)
        if gate is not None:
            gate.touch()
    return chunks, await stream.result()


def signals(chunks: list[Chunk]) -> list[tuple[str, str]]:
    """The notifications streamed: (event, the call it is about)."""
    out = []
    for chunk in chunks:
        if chunk["type"] == "data-signal":
            event, call_id = chunk["data"]["contents"].split(": ", 1)
            assert chunk["data"]["tagName"] == event
            out.append((event, call_id))
    return out


def on_signal(tag: str, gate: Path, count: int = 1) -> Callable[[Chunk], Path | None]:
    """Open `gate` once `count` signals tagged `tag` went by."""
    seen = 0

    def opened(chunk: Chunk) -> Path | None:
        nonlocal seen
        if chunk["type"] == "data-signal" and chunk["data"]["tagName"] == tag:
            seen += 1
            return gate if seen == count else None
        return None

    return opened


async def stored_invocations(app: App) -> dict[str, dict[str, Any]]:
    assert app.store is not None
    return {
        part["toolInvocation"]["toolCallId"]: part["toolInvocation"]
        for msg in await app.store.messages("t1", "r1")
        for part in (msg.get("content") or {}).get("parts") or []
        if part.get("type") == "tool-invocation"
    }


def signal_calls(app: App) -> float:
    """How often the orchestrator called background-work-signals' process_tool_result."""
    return sum(
        sample.value
        for metric in app.metrics.processor_calls.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
        and sample.labels["processor"] == "background-work-signals"
        and sample.labels["hook"] == "process_tool_result"
    )


async def test_a_deferred_call_returns_at_once_and_its_result_lands_in_the_run_and_the_thread(
    sidecars: dict[str, str], tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    step = {"toolCalls": [call("research", topic="tides"), call("hold", gate=str(hold))]}
    cfg = bg_config(
        sidecars,
        tmp_path / "m.db",
        [step, {"text": "done"}],
        {"research": {"sidecar": "bg", "background": {}}},
    )
    async with App(cfg) as app:
        chunks, result = await run(app, "research tides", on_signal("work-completed", hold))
        assert result.status == "success", result.error
        research, held = of_type(chunks, "tool-result")
        research_id = research["toolCallId"]
        assert research["result"].startswith(STARTED)  # the model got the placeholder at once
        assert signals(chunks) == [  # the foreground call (hold) sends none
            ("work-deferred", research_id),
            ("work-completed", research_id),
        ]
        real = {"topic": "tides", "findings": "notes on tides"}
        assert tool_outputs(prompts(app)[1])[research_id] == real  # the next step sees the result
        stored = await stored_invocations(app)
        assert stored[research_id]["state"] == "result"
        assert stored[research_id]["result"] == real
        assert stored[held["toolCallId"]]["result"] == {"released": True}
        assert app.store is not None
        task_id = research["result"][len(STARTED) :].split(".")[0]
        sent = [
            m["content"]["metadata"]["signal"]
            for m in await app.store.messages("t1", "r1")
            if m["role"] == "signal"
        ]
        assert [s["metadata"] for s in sent] == [
            {
                "originRunId": result.run_id,
                "originToolCallId": research_id,
                "taskId": task_id,
                "invocationKind": "tool",
                "disposition": "deferred",
                "status": status,
            }
            for status in ("running", "completed")
        ]


async def test_a_failing_background_call_is_retried_then_stored_as_an_error(
    sidecars: dict[str, str], tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    step = {
        "toolCalls": [call("doomed", failures=5), call("flaky", failures=1), call("hold", gate=str(hold))]
    }
    retried = {"maxRetries": 1, "retryDelay": 0}
    tools = {
        "doomed": {"sidecar": "bg", "tool": "flaky", "background": retried},
        "flaky": {"sidecar": "bg", "background": retried},
    }
    cfg = bg_config(sidecars, tmp_path / "m.db", [step, {"text": "done"}], tools)
    async with App(cfg) as app:

        def opened(chunk: Chunk) -> Path | None:
            ended = [t for t, _ in signals([*chunks_seen, chunk]) if t in ("work-completed", "work-failed")]
            chunks_seen.append(chunk)
            return hold if len(ended) == 2 and chunk["type"] == "data-signal" else None

        chunks_seen: list[Chunk] = []
        chunks, result = await run(app, "try", opened)
        assert result.status == "success", result.error
        doomed, flaky = (r["toolCallId"] for r in of_type(chunks, "tool-result")[:2])
        ends = {call_id: tag for tag, call_id in signals(chunks) if tag != "work-deferred"}
        assert ends == {doomed: "work-failed", flaky: "work-completed"}
        stored = await stored_invocations(app)
        assert stored[doomed]["state"] == "output-error"
        assert stored[doomed]["errorText"].startswith("Background task failed: ")
        assert "attempt 2 failed" in stored[doomed]["errorText"]  # retried once, then given up
        assert stored[flaky]["result"] == {"attempts": 2}  # failed once, the retry answered


async def test_a_result_landing_after_the_run_ended_is_stored_without_a_signal(
    sidecars: dict[str, str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    responses = [
        {"toolCalls": [call("research", topic="moon", gate=str(gate))]},
        {"text": "started"},
        {"text": "ok"},
    ]
    cfg = bg_config(sidecars, tmp_path / "m.db", responses, {"research": {"sidecar": "bg", "background": {}}})
    async with App(cfg) as app:
        chunks, result = await run(app, "research the moon")
        assert result.status == "success", result.error
        (started,) = of_type(chunks, "tool-result")
        call_id = started["toolCallId"]
        assert signals(chunks) == [("work-deferred", call_id)]
        assert (await stored_invocations(app))[call_id]["result"].startswith(STARTED)
        calls_before = signal_calls(app)

        gate.touch()  # the work lands now, the run long over
        await background.drain()
        real = {"topic": "moon", "findings": "notes on moon"}
        assert (await stored_invocations(app))[call_id]["result"] == real
        assert signal_calls(app) == calls_before  # no signal: the run it belonged to is gone
        assert app.store is not None
        stored_signals = [m for m in await app.store.messages("t1", "r1") if m["role"] == "signal"]
        assert len(stored_signals) == 1  # work-deferred's, from when the run was alive

        await run(app, "and?")  # a later turn sees the real result
        assert tool_outputs(prompts(app)[-1])[call_id] == real


def refuse_writes(store: Path, *tables: str) -> None:
    """Make the SQLite store fail every write to `tables` (those it has), as a full or read-only
    disk would: a trigger raising on INSERT and UPDATE."""
    with sqlite3.connect(store) as db:
        have = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in sorted(have & set(tables)):
            for event in ("INSERT", "UPDATE"):
                db.execute(
                    f"CREATE TRIGGER refuse_{event.lower()}_{table} BEFORE {event} ON {table} "
                    "BEGIN SELECT RAISE(ABORT, 'the disk says no'); END"
                )


def failed_writes(app: App, what: str) -> float:
    return app.metrics.total("procmesh_store_writes_failed_total", agent="a", what=what)


async def test_a_late_result_the_store_refuses_is_logged_and_counted(
    sidecars: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The run is over when its background result lands: a store that fails the write leaves the
    stored thread with the placeholder, logged and counted (``what="background-result"``)."""
    gate = tmp_path / "gate"
    responses = [{"toolCalls": [call("research", topic="moon", gate=str(gate))]}, {"text": "started"}]
    cfg = bg_config(sidecars, tmp_path / "m.db", responses, {"research": {"sidecar": "bg", "background": {}}})
    async with App(cfg) as app:
        chunks, result = await run(app, "research the moon")
        assert result.status == "success", result.error
        (started,) = of_type(chunks, "tool-result")
        refuse_writes(tmp_path / "m.db", "messages", "messages_scoped")
        assert failed_writes(app, "background-result") == 0
        gate.touch()  # the work lands now, the run long over
        await background.drain()
        assert failed_writes(app, "background-result") == 1
        assert "storing background tool research's result failed" in caplog.text
        assert (await stored_invocations(app))[started["toolCallId"]]["result"].startswith(STARTED)


async def test_an_awaited_call_waits_for_its_result(sidecars: dict[str, str], tmp_path: Path) -> None:
    tools = {"research": {"sidecar": "bg", "background": {"disposition": "awaited"}}}
    responses = [{"toolCalls": [call("research", topic="sun")]}, {"text": "done"}]
    # in the output lane, with its records renamed: the runtime's records follow the option
    signals_entry = {"processor": "bi/background-work-signals", "options": {"result_key": "_bg"}}
    cfg = bg_config(sidecars, tmp_path / "m.db", responses, tools, outputProcessors=[signals_entry])
    async with App(cfg) as app:
        chunks, result = await run(app, "research the sun")
        assert result.status == "success", result.error
        (settled,) = of_type(chunks, "tool-result")
        call_id = settled["toolCallId"]
        assert settled["result"] == {"topic": "sun", "findings": "notes on sun"}
        assert signals(chunks) == [
            ("work-awaited", call_id),
            ("work-completed", call_id),
        ]
