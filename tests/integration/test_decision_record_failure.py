"""A decision record the store refuses (``decisions.record``): the run's result stands, the
failure is logged and counted in ``procmesh_store_writes_failed_total{what="decision-record"}``,
never lost without a trace. A real gRPC sidecar, a real SQLite store that fails the write."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config

pytestmark = [pytest.mark.asyncio]


class Passes(Processor):
    id = "passes"

    async def process_input(self, messages: list[Any]) -> None:
        return None


def _refuse_writes(store: Path, table: str) -> None:
    with sqlite3.connect(store) as db:
        db.execute(
            f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
            "BEGIN SELECT RAISE(ABORT, 'the disk says no'); END"
        )


async def test_a_decision_record_the_store_refuses_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "m.db"
    async with ProcessorServer([Passes()], ["127.0.0.1:0"]) as sidecar:
        config = parse_config(
            {
                "sidecars": {"s": {"address": sidecar.addresses[0]}},
                "storage": {"path": str(db)},
                "decisions": {"record": True},
                "models": {"m": {"provider": "scripted", "responses": [{"text": "ok"}] * 3}},
                "agents": {
                    "a": {"model": "m", "errorProcessorDefaults": False, "inputProcessors": ["s/passes"]}
                },
            },
            "test config",
        )
        async with App(config) as app:
            assert (await app.agent("a").generate("hi")).status == "success"
            assert app.store is not None  # opened by the run's write
            recorded = await app.store.decisions_between("2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z")
            assert [d.processor for d in recorded] == ["passes"]  # the record works, then the disk fails
            _refuse_writes(db, "run_decisions")
            result = await app.agent("a").generate("hi")
            assert result.status == "success"  # the run's result stands
            failed = app.metrics.total(
                "procmesh_store_writes_failed_total", agent="a", what="decision-record"
            )
            assert failed == 1
            assert f"run {result.run_id}: its decision record could not be written" in caplog.text
