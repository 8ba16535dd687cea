"""`Model.report_saved` (the SDK side of ``ModelService.ReportSaved``): a report never fails or
slows a hook, and reports made while one is on its way go together in the next. A real grpc.aio
server plays the gateway on 127.0.0.1 and records what it is told."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from procmesh import _model
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from tests.integration.fake_gateway import serve_gateway
from tests.integration.service.test_lifecycle import eventually


class _Gateway(mgrpc.ModelServiceServicer):
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, int]] = []
        self.refuse = False

    async def ReportSaved(self, request: Any, context: Any) -> mpb.ModelServiceReportSavedResponse:
        self.reports.append((request.processor_id, request.run_id, request.count))
        if self.refuse:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        await asyncio.sleep(0.05)  # long enough for reports made meanwhile to wait for the next
        return mpb.ModelServiceReportSavedResponse()


@pytest_asyncio.fixture
async def gateway() -> AsyncIterator[_Gateway]:
    async for servicer in serve_gateway(_Gateway()):
        yield servicer


async def test_reports_made_while_one_is_sent_go_together_in_the_next(gateway: _Gateway) -> None:
    model = _model.Model("judge", "moderation", "run-1")
    model.report_saved()  # returns at once: sent in the background
    await eventually(lambda: len(gateway.reports) == 1)
    for _ in range(3):
        model.report_saved()  # while the first is on its way
    _model.Model("judge", "pii", "run-1").report_saved(2)
    await eventually(lambda: sum(count for _, _, count in gateway.reports) == 6)
    assert gateway.reports == [("moderation", "run-1", 1), ("moderation", "run-1", 3), ("pii", "run-1", 2)]


async def test_a_refused_report_is_dropped_and_the_next_one_still_goes(gateway: _Gateway) -> None:
    gateway.refuse = True
    model = _model.Model("judge", "moderation", "run-2")
    model.report_saved()
    await eventually(lambda: len(gateway.reports) == 1)
    gateway.refuse = False
    model.report_saved(0)  # nothing to count: nothing sent
    model.report_saved()
    await eventually(lambda: len(gateway.reports) == 2)
    assert gateway.reports == [("moderation", "run-2", 1), ("moderation", "run-2", 1)]


async def test_without_a_gateway_a_report_is_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROCMESH_MODEL_GATEWAY", raising=False)
    _model.configure(None)
    _model.Model("judge", "moderation", "").report_saved()  # no PROCMESH_MODEL_GATEWAY: no error
