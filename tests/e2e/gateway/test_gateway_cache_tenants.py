"""The verdict cache never answers one tenant with a verdict asked for another.

A real orchestrator process with ``judgeCache`` on serves the model gateway on ``--grpc-socket``,
where a tenant key is served and names the tenant (the resource it is bound to). The same
deterministic question (a schema, temperature 0) asked with a key bound to no tenant, then with two
tenants' keys, is asked of the model three times; asked again with the first tenant's key it is that
tenant's cached answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from procmesh import convert
from procmesh.v1 import model_pb2_grpc as mgrpc
from tests.e2e.gateway.support import GATEWAY_KEY, KEYS, gateway_calls, judge_calls_saved
from tests.e2e.gateway.test_gateway_cached import CONFIG
from tests.e2e.gateway.test_gateway_cached import _call as question
from tests.e2e.service.conftest import OrchestratorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TENANT_A = "tenant-a-key-0123456789"
TENANT_B = "tenant-b-key-0123456789"


async def test_the_same_question_of_two_tenants_is_asked_twice(
    start_orchestrator: Callable[..., OrchestratorProcess], sidecar_dir: Path
) -> None:
    socket = sidecar_dir / "tenants.sock"
    orchestrator = await asyncio.to_thread(
        start_orchestrator,
        CONFIG,
        "--grpc-socket",
        str(socket),
        env={"PROCMESH_API_KEYS": f"{KEYS},{TENANT_A}=tenant-a,{TENANT_B}=tenant-b"},
    )
    answers = []
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = mgrpc.ModelServiceStub(channel)
        for key in (GATEWAY_KEY, TENANT_A, TENANT_B, TENANT_A):
            metadata = (("authorization", f"Bearer {key}"),)
            answers.append(await stub.Generate(question("hello"), timeout=10, metadata=metadata))
    unbound, first_a, first_b, again_a = answers
    assert all(convert.from_value(a.object) == {"allowed": True} for a in answers)
    assert unbound.usage.total_tokens > 0  # asked the model
    assert first_a.usage.total_tokens > 0, "tenant-a was answered with a key's of no tenant"
    assert first_b.usage.total_tokens > 0, "tenant-b was answered with tenant-a's cached verdict"
    assert not again_a.HasField("usage")  # tenant-a's own verdict, reused
    assert gateway_calls(orchestrator)[("allow", "other", "ok")] == 4
    assert judge_calls_saved(orchestrator, "cache") == 1
