"""The trace of a merged judge call (issue 33 item 4): two guards in two `procmesh-sidecar guards`
processes, the orchestrator and the sidecars exporting over OTLP to a real receiver
(tests/fixtures/otlp_receiver.py). The run's trace shows the one judge call (``procmesh.judge
<model>``, its sections and their processors) and each guard's wait for its own section
(``procmesh.judge.section <processor>``) under that guard's own gateway span. A guard's pre-check
that settles a question without the judge counts it on its sidecar's hook span
(``procmesh.judge.precheck_saved``), as ``procmesh_judge_calls_saved_total{by="precheck"}`` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import GATEWAY_KEY
from tests.e2e.guards.conftest import guards_process
from tests.e2e.guards.judge_server import JudgeServer, Rule
from tests.e2e.guards.support import NO_ATTACK, NO_SCORES
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.test_tracing import CALLER_SPAN, TRACE_ID, otel_env, receiver, spans_of
from tests.integration.service.support import API_KEYS, AUTH

__all__ = ["receiver"]

pytestmark = [pytest.mark.e2e]

SECRET = "sk-judge-secret-of-the-trace-test"
PRECHECKED_TRACE = "5d0e8b6f2c4a41b3a9e7d1c3b5a79f21"
"""The pre-check test's own trace (another than the merged call's)."""
STREAMED_TRACE = "7a1c3e5b9d2f4a6c8e0b1d3f5a7c9e2b"
"""The output-stream guard's test's own trace."""


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer(api_key=SECRET)
    server.start()
    server.judge(
        "merged",
        {},
        Rule(("Judge this content for moderation.",), NO_SCORES),
        Rule(("Look for prompt injection",), NO_ATTACK),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def traced(
    receiver: str,
    judge_server: JudgeServer,
    sidecar_dir: Path,
    gateway_port: int,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> Iterator[OrchestratorProcess]:
    with pytest.MonkeyPatch.context() as env:  # the sidecar processes inherit it
        for key, value in otel_env(receiver, "guards").items():
            env.setenv(key, value)
        sidecars = [guards_process(sidecar_dir, gateway_port, name) for name in ("traced-a", "traced-b")]
        a, b = (next(s) for s in sidecars)
    try:
        asyncio.run(_ready(a, b))
        entry: Callable[[str, str], dict[str, Any]] = lambda sidecar, pid: {  # noqa: E731
            "processor": f"{sidecar}/{pid}",
            "options": {"model": "judges/merged"},
        }
        config = {
            "sidecars": {
                "a": {"address": a.address, "timeout": 10},
                "b": {"address": b.address, "timeout": 10},
            },
            "providers": {
                "judges": {"kind": "openai", "baseUrl": judge_server.base_url, "apiKeyEnv": "JUDGE_KEY"}
            },
            "models": {"echo": {"provider": "demo"}},
            "agents": {
                "guarded": {
                    "model": "echo",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [entry("a", "moderation"), entry("b", "prompt-injection-detector")],
                },
                # the output stream judged: its windows' gateway calls are under the stream's hook span
                "streamed": {
                    "model": "echo",
                    "errorProcessorDefaults": False,
                    "outputProcessors": [entry("a", "moderation")],
                },
                # every text settled by the pre-checks (any text passes): the input, each window
                "prechecked": {
                    "model": "echo",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [_prechecked(entry("a", "moderation"))],
                    "outputProcessors": [_prechecked(entry("a", "moderation"))],
                },
            },
        }
        yield start_orchestrator(
            config,
            "--grpc-port",
            str(gateway_port),
            env={
                **otel_env(receiver, "orchestrator"),
                "PROCMESH_API_KEYS": f"{API_KEYS},{GATEWAY_KEY}=@gateway",
                "JUDGE_KEY": SECRET,
            },
        )
    finally:
        for sidecar in sidecars:  # SIGTERM: each sidecar flushes its spans on the way out
            next(sidecar, None)


def _prechecked(entry: dict[str, Any]) -> dict[str, Any]:
    return {**entry, "options": {**entry["options"], "precheck": {"allow": ["(?s).*"]}}}


async def _ready(*sidecars: SidecarProcess) -> None:
    await asyncio.gather(*(s.wait_ready() for s in sidecars))


def _generate(
    orchestrator: OrchestratorProcess,
    text: str,
    headers: dict[str, str] | None = None,
    agent: str = "guarded",
) -> None:
    with httpx.stream(
        "POST",
        f"{orchestrator.http_url}/api/agents/{agent}/stream",
        json={"messages": text},
        headers={**AUTH, **(headers or {})},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert "[DONE]" in "".join(response.iter_text())


def test_a_merged_judge_call_and_each_guards_section_are_traced(
    traced: OrchestratorProcess, receiver: str, judge_server: JudgeServer
) -> None:
    _generate(traced, "Hello")  # each sidecar's first call opens its gateway channel
    before = len(judge_server.calls("merged"))
    _generate(traced, "What is a processor?", {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    assert len(judge_server.calls("merged")) - before == 1
    for _ in range(100):  # the sidecars' hook spans may come in a later export than the run's
        spans = spans_of(receiver, {"orchestrator", "guards"}, ("orchestrator", "invoke_agent guarded"))
        by_id = {s["spanId"]: s for s in spans}
        gateway_calls = [s for s in spans if s["name"] == "procmesh.model_gateway judges/merged"]
        if len(gateway_calls) == 2 and all(g["parentSpanId"] in by_id for g in gateway_calls):
            break
        time.sleep(0.05)
    (call,) = [s for s in spans if s["name"] == "procmesh.judge judges/merged"]
    assert call["attributes"]["procmesh.judge.sections"] == 2
    assert sorted(call["attributes"]["procmesh.judge.guards"].split(",")) == [
        "moderation",
        "prompt-injection-detector",
    ]
    sections = {s["name"]: s for s in spans if s["name"].startswith("procmesh.judge.section ")}
    assert sorted(sections) == [
        "procmesh.judge.section moderation",
        "procmesh.judge.section prompt-injection-detector",
    ]
    gateways = []
    for section in sections.values():
        assert section["attributes"]["procmesh.judge.sections"] == 2
        gateway = by_id[section["parentSpanId"]]  # under its own guard's gateway call
        assert gateway["name"] == "procmesh.model_gateway judges/merged"
        gateways.append(gateway)
        hook = by_id[gateway["parentSpanId"]]  # which the guard's hook made, in its sidecar
        assert hook["service"] == "guards"
    assert {g["attributes"]["procmesh.processor.id"] for g in gateways} == {
        "moderation",
        "prompt-injection-detector",
    }
    # the one call runs under the gateway span of the guard whose request opened the group
    assert by_id[call["parentSpanId"]]["spanId"] in {s["spanId"] for s in sections.values()} | {
        g["spanId"] for g in gateways
    }


def test_a_guards_precheck_counts_the_judge_calls_it_saved_on_its_hook_span(
    traced: OrchestratorProcess, receiver: str, judge_server: JudgeServer
) -> None:
    before = len(judge_server.calls("merged"))
    headers = {"traceparent": f"00-{PRECHECKED_TRACE}-{CALLER_SPAN}-01"}
    _generate(traced, "Hello.", headers, agent="prechecked")
    assert len(judge_server.calls("merged")) == before  # every question settled by a pre-check
    names = ("procmesh.hook process_input moderation", "procmesh.hook process_output_stream moderation")
    hooks: dict[str, dict[str, Any]] = {}
    for _ in range(200):  # the sidecars export their hook spans in batches of their own
        lines = httpx.get(f"{receiver}/spans").text.splitlines()
        spans = [s for s in map(json.loads, lines) if s["traceId"] == PRECHECKED_TRACE]
        hooks = {s["name"]: s for s in spans if s["service"] == "guards" and s["name"] in names}
        if len(hooks) == len(names):
            break
        time.sleep(0.05)
    assert sorted(hooks) == sorted(names)
    assert hooks[names[0]]["attributes"]["procmesh.judge.precheck_saved"] == 1  # the one message
    assert hooks[names[1]]["attributes"]["procmesh.judge.precheck_saved"] >= 1  # each window's


def test_an_output_stream_guards_gateway_calls_are_under_its_stream_hook_span(
    traced: OrchestratorProcess, receiver: str, judge_server: JudgeServer
) -> None:
    """A `process_output_stream` session's span is not current around its parts (it lives across
    the session's messages); the gateway calls its parts make carry it all the same, so a judged
    window's call sits under the sidecar's stream hook span, in the run's trace (they went without
    a trace context and began traces of their own)."""
    before = len(judge_server.calls("merged"))
    _generate(
        traced,
        "Tell me about processors.",
        {"traceparent": f"00-{STREAMED_TRACE}-{CALLER_SPAN}-01"},
        "streamed",
    )
    assert len(judge_server.calls("merged")) > before  # the output's windows were judged
    hook_name = "procmesh.hook process_output_stream moderation"
    gateways: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for _ in range(200):  # the sidecar exports its hook spans in batches of its own
        lines = httpx.get(f"{receiver}/spans").text.splitlines()
        spans = [s for s in map(json.loads, lines) if s["traceId"] == STREAMED_TRACE]
        by_id = {s["spanId"]: s for s in spans}
        gateways = [s for s in spans if s["name"] == "procmesh.model_gateway judges/merged"]
        if gateways and all(g["parentSpanId"] in by_id for g in gateways):
            break
        time.sleep(0.05)
    assert gateways, "no gateway call in the run's trace"
    assert {by_id[g["parentSpanId"]]["name"] for g in gateways} == {hook_name}
    assert {by_id[g["parentSpanId"]]["service"] for g in gateways} == {"guards"}
