"""The fuzz tier: what any client can send the orchestrator's APIs never makes a 5xx or an UNKNOWN.

A real ``procmesh-orchestrator`` process over a real sidecar gets hypothesis-generated JSON bodies
(arbitrary JSON, message-shaped bodies with deep nesting, lone surrogates and huge values), raw
random bytes, and raw and generated gRPC requests. After all of it the process is alive and
healthy, and nothing of the input (every string carries a marker) is in its log at INFO.
Counts are bounded so the tier takes well under a minute on 2 cores.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procmesh.v1 import agent_pb2 as apb
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, GRPC_AUTH, service_config

pytestmark = pytest.mark.e2e

MARK = "FZQX"
"""In every generated string: the log must never contain it."""
FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,  # the same cases every run: a failure reproduces
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON = {"content-type": "application/json"}
BAD_GRPC = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
seen: Counter[str] = Counter()
"""Status counts of every case, printed at the end (the closing note quotes them)."""

marked_text = st.text(max_size=40).map(lambda s: MARK + s)
surrogate = st.integers(0xD800, 0xDFFF).map(lambda c: f"{MARK}\\u{c:04x}")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | marked_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(marked_text, inner, max_size=4),
    max_leaves=30,
)


def deep(depth: int) -> Any:
    value: Any = MARK
    for _ in range(depth):
        value = {"k": value}
    return value


parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": marked_text}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image", "file", "tool-invocation", MARK]), "x": json_values}
    ),
    json_values,
)
messages = st.one_of(
    marked_text,
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "tool", MARK]),
            "content": st.one_of(marked_text, st.lists(parts, max_size=3), json_values),
        }
    ),
    st.fixed_dictionaries(
        {
            "id": marked_text,
            "role": st.just("user"),
            "threadId": marked_text,
            "content": st.fixed_dictionaries(
                {
                    "format": st.sampled_from([2, 3, MARK]),
                    "parts": st.lists(parts, max_size=3),
                    "metadata": st.one_of(json_values, st.integers(1, 60).map(deep)),
                }
            ),
        }
    ),
)
bodies = st.fixed_dictionaries(
    {"messages": st.one_of(marked_text, st.lists(messages, max_size=4), json_values)},
    optional={
        "maxSteps": json_values,
        "maxProcessorRetries": json_values,
        "requestContext": json_values,
        "resourceId": json_values,
        "threadId": json_values,
    },
)


@pytest.fixture(scope="module")
def orchestrator(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> Iterator[OrchestratorProcess]:
    sidecar = start_sidecar("examples", name="fuzz-guards")
    import asyncio

    asyncio.run(sidecar.wait_ready())
    config = service_config({"guards": sidecar.address})
    proc = start_orchestrator(config, env={"PROCMESH_API_KEYS": API_KEYS})
    yield proc
    print(f"\nfuzz cases by outcome: {dict(sorted(seen.items()))}")


@pytest.fixture(scope="module")
def http(orchestrator: OrchestratorProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def channel(orchestrator: OrchestratorProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(orchestrator.grpc_address) as chan:
        yield chan


def post(http: httpx.Client, route: str, content: bytes) -> None:
    response = http.post(
        f"/api/agents/assistant/{route}", content=content, headers={"content-type": "application/json"}
    )
    seen[f"http {response.status_code}"] += 1
    assert response.status_code < 500, response.text[:300]
    if route == "stream" and response.status_code == 200:
        assert '"internal error"' not in response.text


def check_grpc(send: Callable[[], Any]) -> None:
    """Send one request; whatever it is refused with, never UNKNOWN or INTERNAL."""
    code = grpc.StatusCode.OK
    details = ""
    try:
        send()
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    seen[f"grpc {code.name}"] += 1
    assert code not in BAD_GRPC, details


@settings(FUZZ, max_examples=500)
@given(body=bodies, route=st.sampled_from(["generate", "stream"]))
def test_message_shaped_bodies_never_get_a_5xx(http: httpx.Client, body: dict[str, Any], route: str) -> None:
    post(http, route, json.dumps(body).encode())


@settings(FUZZ, max_examples=300)
@given(body=json_values)
def test_arbitrary_json_never_gets_a_5xx(http: httpx.Client, body: Any) -> None:
    post(http, "generate", json.dumps(body).encode())


@settings(FUZZ, max_examples=300)
@given(text=st.lists(surrogate, min_size=1, max_size=3).map("".join), depth=st.integers(0, 3000))
def test_surrogates_and_deep_nesting_never_get_a_5xx(http: httpx.Client, text: str, depth: int) -> None:
    # `text` holds raw JSON escapes (\\ud83d...): lone surrogates once decoded
    post(http, "generate", ('{"messages": ' + "[" * depth + f'"{text}"' + "]" * depth + "}").encode())


@settings(FUZZ, max_examples=300)
@given(raw=st.binary(max_size=300))
def test_random_bytes_never_get_a_5xx(http: httpx.Client, raw: bytes) -> None:
    post(http, "generate", raw)


@settings(FUZZ, max_examples=300)
@given(raw=st.binary(max_size=300), method=st.sampled_from(["Generate", "Stream"]))
def test_random_grpc_bytes_are_never_unknown(channel: grpc.Channel, raw: bytes, method: str) -> None:
    path = f"/procmesh.v1.AgentService/{method}"
    call = channel.unary_unary(path) if method == "Generate" else channel.unary_stream(path)

    def send() -> None:
        result = call(raw, metadata=GRPC_AUTH, timeout=20)
        if method == "Stream":
            list(result)

    check_grpc(send)


@settings(FUZZ, max_examples=300)
@given(text=marked_text, metadata=st.one_of(json_values, st.integers(1, 45).map(deep)), agent=marked_text)
def test_generated_grpc_requests_are_never_unknown(
    channel: grpc.Channel, text: str, metadata: Any, agent: str
) -> None:
    request = apb.GenerateRequest(agent_id=agent if agent.endswith("x") else "assistant", text=text)
    message = request.messages.add(id=MARK, role="user")
    message.content.parts.add().text.text = text
    try:
        if isinstance(metadata, dict):
            message.content.metadata.update(metadata)
    except (ValueError, TypeError, RecursionError):
        return  # not representable as a Struct: nothing to send
    stub = channel.unary_unary(
        "/procmesh.v1.AgentService/Generate",
        request_serializer=apb.GenerateRequest.SerializeToString,
        response_deserializer=apb.GenerateResponse.FromString,
    )
    check_grpc(lambda: stub(request, metadata=GRPC_AUTH, timeout=20))


def test_after_the_fuzz_the_process_is_healthy_and_logged_no_input(
    orchestrator: OrchestratorProcess, http: httpx.Client, channel: grpc.Channel
) -> None:
    assert orchestrator.proc.poll() is None
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    log = orchestrator.log()
    assert MARK not in log, [line for line in log.splitlines() if MARK in line][:5]
    assert "Traceback" not in log
    assert sum(seen.values()) >= 2000, seen
