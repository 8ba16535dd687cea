"""The model gateway refuses a run's judge questions between a failed model call and the run's
next attempt (``outcome="attempt_failed"``), a question its verdict cache holds too: the fast path
that answers a cached question in the step that reads it refuses it as the slow path does.

The in-process service over real gRPC, ``judgeCache`` on; the App's ``failed``/``began`` hooks,
which a run calls as its model call fails and as its next attempt begins (tests/e2e/guards/
test_judge_refused_after_failure.py runs that whole path, without the cache)."""

from __future__ import annotations

import grpc
import pytest

from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.e2e.gateway.test_gateway_cached import CONFIG
from tests.e2e.gateway.test_gateway_cached import _call as question

pytestmark = [pytest.mark.asyncio]


async def test_a_cached_question_of_a_failed_attempt_is_refused_until_the_next_attempt() -> None:
    async with Service(OrchestratorSettings(http_port=0, grpc_port=0), parse_config(CONFIG)) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = mgrpc.ModelServiceStub(channel)
            asked = question("hello")
            asked.run_id = "r1"
            assert (await stub.Generate(asked, timeout=10)).usage.total_tokens > 0  # asked the model
            assert not (await stub.Generate(asked, timeout=10)).HasField("usage")  # the cache's
            service.app.failed("r1")  # the run's model call failed: its guards' questions are stale
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(asked, timeout=10)
            assert refused.value.code() == grpc.StatusCode.CANCELLED
            service.app.began("r1")  # its retry began: its questions are answered again
            assert not (await stub.Generate(asked, timeout=10)).HasField("usage")
        calls = service.app.metrics.total("procmesh_gateway_calls_total", outcome="attempt_failed")
    assert calls == 1
