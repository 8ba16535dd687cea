"""Issue 13, defect 5, in both SDKs as real processes: bad bytes are a short INVALID_ARGUMENT.

The package's long-lived Node and Python sidecars (conftest) get undecodable requests on every
RPC kind and a 100 KB unknown processor id; neither may answer UNKNOWN/INTERNAL, echo the id until
RESOURCE_EXHAUSTED, or write the request's content into its log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh import SERVICE_NAME
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.conftest import Sidecars

pytestmark = pytest.mark.e2e

TIMEOUT = 5.0
MARKER = b"hardening-secret-marker"
GARBAGE = b"\xff\xff\xff\xff\x0f" + MARKER


@pytest.fixture(params=["node", "python"])
def language(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def channel(sidecars: Sidecars, language: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(getattr(sidecars, language)) as chan:
        yield chan


def status(channel: grpc.Channel, rpc: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    call: Any = channel.unary_unary(f"/{SERVICE_NAME}/{rpc}")
    try:
        call(payload, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("rpc", ["Describe", "ProcessInput", "ProcessOutputStep", "ExecuteTool"])
def test_undecodable_unary_requests_are_invalid_argument(channel: grpc.Channel, rpc: str) -> None:
    code, details = status(channel, rpc, GARBAGE)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"not a valid procmesh.v1.{rpc}Request" in details
    assert MARKER.decode() not in details


def test_an_undecodable_stream_request_is_invalid_argument(channel: grpc.Channel) -> None:
    call: Any = channel.stream_stream(f"/{SERVICE_NAME}/ProcessOutputStream")
    with pytest.raises(grpc.RpcError) as info:
        for _ in call(iter([GARBAGE]), timeout=TIMEOUT):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid procmesh.v1.ProcessOutputStreamRequest" in (info.value.details() or "")


def test_a_huge_unknown_processor_id_is_not_echoed(channel: grpc.Channel) -> None:
    req = ppb.ProcessInputRequest(context=tpb.RunContext(processor_id="x" * 100_000))
    code, details = status(channel, "ProcessInput", req.SerializeToString())
    assert code == grpc.StatusCode.NOT_FOUND
    assert "(100000 characters)" in details
    assert len(details) < 1024


def test_after_refusals_the_sidecar_is_serving_and_its_log_has_no_input(
    sidecars: Sidecars, channel: grpc.Channel, language: str
) -> None:
    for _ in range(20):
        assert status(channel, "ProcessInput", GARBAGE)[0] == grpc.StatusCode.INVALID_ARGUMENT
    stub = health_pb2_grpc.HealthStub(channel)
    resp = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    log = Path(sidecars.dir / f"{language}.log").read_text(errors="replace")
    assert MARKER.decode() not in log
    assert "Traceback" not in log
    assert "refused a malformed" in log
