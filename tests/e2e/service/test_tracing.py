"""One trace across the orchestrator, a Python sidecar and a Node sidecar, exported over OTLP.

A real OTLP/HTTP receiver (tests/fixtures/otlp_receiver.py, on the official opentelemetry-proto
messages) collects what the three processes export; a streamed run that arrives with a W3C
`traceparent` must come back as one trace whose parent links are right: the caller's span ->
the run -> each hook call (client) -> the sidecar's span of that hook (server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import node_sidecar, require_node, wait_all
from tests.e2e.service.conftest import OrchestratorProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SECRET = "my card is 4111 1111 1111 1111"


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port_file = tmp_path_factory.mktemp("otlp") / "port"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fixtures" / "otlp_receiver.py"), str(port_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None, "the OTLP receiver exited"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.terminate()
        proc.wait(10)


def otel_env(endpoint: str, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export soon after a span ends
    }


@pytest.fixture(scope="module")
def traced(
    receiver: str,
    tmp_path_factory: pytest.TempPathFactory,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> Iterator[OrchestratorProcess]:
    require_node()
    workdir = tmp_path_factory.mktemp("sidecars")
    with pytest.MonkeyPatch.context() as env:  # the sidecar processes inherit it
        for key, value in otel_env(receiver, "py-sidecar").items():
            env.setenv(key, value)
        python = SidecarProcess(
            ["examples"], f"unix://{workdir / 'py.sock'}", log_path=str(workdir / "py.log")
        )
        python.start()
        env.setenv("OTEL_SERVICE_NAME", "node-sidecar")
        node = node_sidecar(
            REPO / "sdk" / "node" / "examples" / "serve.mjs",
            f"unix://{workdir / 'node.sock'}",
            workdir / "node.log",
        )
    try:
        wait_all([python, node])
        config: dict[str, Any] = {
            "sidecars": {"py": {"address": python.address}, "node": {"address": node.address}},
            "agents": {
                "traced": {
                    "model": "demo",
                    "errorProcessorDefaults": False,
                    "inputProcessors": ["py/pii-redactor"],
                    "outputProcessors": ["node/word-counter"],
                }
            },
        }
        yield start_orchestrator(config, env=otel_env(receiver, "orchestrator"))
    finally:
        python.stop(grace=5.0)  # SIGTERM: each sidecar flushes its spans on the way out
        node.stop(grace=5.0)


def spans_of(receiver: str, services: set[str], root: tuple[str, str]) -> list[dict[str, Any]]:
    """The trace's spans once every service has exported some and the `root` (service, name) span
    is among them: it ends last, after the stream's last chunk, so it may come in a later export
    batch than its children (bounded: the receiver is local)."""
    spans: list[dict[str, Any]] = []
    for _ in range(200):
        lines = httpx.get(f"{receiver}/spans").text.splitlines()
        spans = [s for s in map(json.loads, lines) if s["traceId"] == TRACE_ID]
        exported = {s["service"] for s in spans}
        if services <= exported and any((s["service"], s["name"]) == root for s in spans):
            return spans
        time.sleep(0.05)
    raise AssertionError(f"not every service exported spans of the trace, or no {root}; got {spans}")


def one(spans: list[dict[str, Any]], service: str, name: str) -> dict[str, Any]:
    found = [s for s in spans if s["service"] == service and s["name"] == name]
    assert len(found) == 1, (service, name, [(s["service"], s["name"]) for s in spans])
    return found[0]


def test_a_run_is_one_trace_across_the_orchestrator_and_both_sidecars(
    traced: OrchestratorProcess, receiver: str
) -> None:
    headers = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
    body = {"messages": [{"role": "user", "content": SECRET}]}
    with httpx.stream(
        "POST", f"{traced.http_url}/api/agents/traced/stream", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        assert "[DONE]" in "".join(response.iter_text())

    spans = spans_of(
        receiver, {"orchestrator", "py-sidecar", "node-sidecar"}, ("orchestrator", "invoke_agent traced")
    )
    run = one(spans, "orchestrator", "invoke_agent traced")
    assert run["parentSpanId"] == CALLER_SPAN
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert run["attributes"]["procmesh.outcome"] == "success"

    step = one(spans, "orchestrator", "step 0")
    assert step["parentSpanId"] == run["spanId"]
    chat = one(spans, "orchestrator", "chat demo")
    assert chat["parentSpanId"] == step["spanId"]
    assert chat["attributes"]["gen_ai.request.model"] == "demo"
    assert chat["attributes"]["gen_ai.usage.output_tokens"] >= 1

    hook = one(spans, "orchestrator", "procmesh.hook process_input pii-redactor")
    assert hook["parentSpanId"] == run["spanId"]  # processInput runs before the first step
    assert hook["attributes"]["procmesh.outcome"] in ("pass", "rewrite")
    served = one(spans, "py-sidecar", "procmesh.hook process_input pii-redactor")
    assert served["parentSpanId"] == hook["spanId"]
    assert served["attributes"]["procmesh.processor.id"] == "pii-redactor"

    stream = one(spans, "orchestrator", "procmesh.hook process_output_stream word-counter")
    assert stream["parentSpanId"] == step["spanId"]
    node = one(spans, "node-sidecar", "procmesh.hook process_output_stream word-counter")
    assert node["parentSpanId"] == stream["spanId"]

    # No user content in any attribute of any process. The pieces are the message's own words and the card
    # number's runs of digits with their separators: a bare "4111" also turns up by chance in a random run id.
    pieces = ("my card", "4111 1111", "1111 1111")
    for span in spans:
        for value in span["attributes"].values():
            assert not any(piece in str(value) for piece in pieces), span


def test_without_an_endpoint_nothing_is_exported(receiver: str) -> None:
    # The receiver only ever sees the traced module's trace: an untraced process exports nothing.
    code = (
        "from procmesh import tracing; import sys; "
        "sys.exit(0 if tracing.setup('x') is False and not tracing.enabled() else 1)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver
    env["OTEL_SDK_DISABLED"] = "true"
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
