"""What hosted tools write and show the model, and what processors read of the message list, through
real sidecar processes (tests/fixtures/data_sidecar.py, tests/fixtures/node_data_tools.js and the
built-in sidecar) over gRPC, in an App on the scripted model (SEED-GAPS H6, J11, B4, B6):

- a hosted tool's ``writer.custom()`` chunks (Python and Node SDK) reach the stream at the call's
  turn, in the model's call order, before the call's ``tool-result``;
- a tool's ``toModelOutput`` is what the model's next prompt shows, while the caller's chunk, the
  step's results and the stored message keep the result; ``tool-call-filter``'s
  ``preserve_model_output`` keeps it in a compact form;
- a processor reads the seeds' per-source views (``get.input`` / ``get.response`` /
  ``get.remembered``) and the legacy flattened ``content.content``, and a message it adds in that
  flat form reaches the model as text;
- token-limiter's ``tokenCounter`` and ``onMemoryTrim`` as a subclass hosted in your own sidecar
  (SEED-GAPS J4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh import ProcessorClient, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import node_sidecar, require_node
from tests.e2e.tools.harness import call, collect, config, of_type, prompts, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DONE = {"text": "all done"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def data_sidecar(start_sidecar: Callable[..., SidecarProcess]) -> str:
    """`python -m tests.fixtures.data_sidecar`: its address."""
    proc = start_sidecar(name="data", module="tests.fixtures.data_sidecar")
    await proc.wait_ready()
    return proc.address


@pytest.fixture(scope="module")
def node_data(socket_dir: Path) -> Iterator[str]:
    """`node tests/fixtures/node_data_tools.js`: its address."""
    require_node()
    script = REPO / "tests" / "fixtures" / "node_data_tools.js"
    proc = node_sidecar(script, f"unix://{socket_dir / 'nodedata.sock'}", socket_dir / "nodedata.log")
    try:
        asyncio.run(proc.wait_ready())
        yield proc.address
    finally:
        proc.stop(grace=2.0)


def data_config(
    py: str, node: str, responses: list[dict[str, Any]], builtins: str | None = None, **agent: Any
) -> Config:
    """Agent ``a`` with the tools ``report`` (sidecar ``d``) and ``tally`` (``n``); ``b`` is
    `builtins`, when given."""
    sidecars = {"d": {"address": py, "timeout": 5}, "n": {"address": node, "timeout": 5}}
    if builtins is not None:
        sidecars["b"] = {"address": builtins, "timeout": 5}
    return config(
        sidecars=sidecars,
        tools={"report": {"sidecar": "d"}, "tally": {"sidecar": "n"}},
        responses=responses,
        **agent,
    )


async def test_hosted_tools_write_data_chunks_at_their_turn(data_sidecar: str, node_data: str) -> None:
    calls = [call("report", rows=2), call("tally", items=["a", "b"]), call("report", rows=1)]
    async with App(data_config(data_sidecar, node_data, [{"toolCalls": calls}, DONE])) as app:
        chunks, result = await collect(app)
    assert result.status == "success", result.error
    seen = [
        (c["type"], c.get("data") or c["payload"]["toolCallId"])
        for c in chunks
        if c["type"] in ("data-report", "data-tally", "tool-result")
    ]
    assert seen == [
        ("data-report", {"row": 1}),
        ("data-report", {"row": 2}),
        ("tool-result", "call_1"),
        ("data-tally", {"item": "a"}),
        ("data-tally", {"item": "b"}),
        ("tool-result", "call_2"),
        ("data-report", {"row": 1}),
        ("tool-result", "call_3"),
    ]


async def test_the_model_sees_the_model_output_and_the_caller_the_result(
    data_sidecar: str, node_data: str
) -> None:
    calls = [call("report", rows=3), call("tally", items=["x"])]
    async with App(data_config(data_sidecar, node_data, [{"toolCalls": calls}, DONE])) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert tool_outputs(sent[1]) == {
        "call_1": {"type": "text", "value": "3 rows"},
        "call_2": {"type": "text", "value": "1 items"},
    }
    rows = {"rows": [{"row": 1}, {"row": 2}, {"row": 3}], "note": "raw"}
    raw = {"call_1": rows, "call_2": {"items": ["x"], "note": "raw"}}
    assert {r["toolCallId"]: r["result"] for r in of_type(chunks, "tool-result")} == raw
    assert {r["toolCallId"]: r["result"] for r in result.steps[0]["toolResults"]} == raw
    (assistant, *_) = [m for m in result.response_messages if m["role"] == "assistant"]
    kept = {
        p["toolInvocation"]["toolCallId"]: (p["toolInvocation"]["result"], p["providerMetadata"]["mastra"])
        for p in assistant["content"]["parts"]
        if p["type"] == "tool-invocation"
    }
    assert kept["call_1"] == (rows, {"modelOutput": {"type": "text", "value": "3 rows"}})


async def test_a_result_process_tool_result_replaced_is_what_the_model_sees(
    data_sidecar: str, node_data: str
) -> None:
    cfg = data_config(
        data_sidecar,
        node_data,
        [{"toolCalls": [call("report", rows=2)]}, DONE],
        outputProcessors=["d/redact"],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert tool_outputs(sent[1]) == {"call_1": {"redacted": True}}  # never the tool's own model output
    assert [r["result"] for r in of_type(chunks, "tool-result")] == [{"redacted": True}]


async def test_tool_call_filter_keeps_a_filtered_model_output(
    data_sidecar: str, node_data: str, start_sidecar: Callable[..., SidecarProcess]
) -> None:
    builtins = start_sidecar("tool-call-filter", name="tcf")
    await builtins.wait_ready()
    cfg = data_config(
        data_sidecar,
        node_data,
        [{"toolCalls": [call("report", rows=2)]}, DONE],
        builtins.address,
        inputProcessors=[
            {
                "processor": "b/tool-call-filter",
                "options": {"filter_after_tool_steps": 0, "preserve_model_output": True},
            }
        ],
    )
    async with App(cfg) as app:
        _, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    texts = [p.get("text") for m in sent[1] if m["role"] == "assistant" for p in m["content"]]
    assert texts == ["report result:\n2 rows"]
    assert "raw" not in str(sent[1])


async def test_processors_read_the_views_by_source_and_the_flat_text(
    data_sidecar: str, node_data: str, tmp_path: Path
) -> None:
    responses: list[dict[str, Any]] = [{"text": "one"}, {"toolCalls": [call("report", rows=1)]}, DONE]
    cfg = data_config(
        data_sidecar,
        node_data,
        responses,
        memory={},
        inputProcessors=["d/views"],
        top={"storage": {"path": str(tmp_path / "memory.db")}},
    )
    options = CallOptions(thread_id="t1", resource_id="r1")
    async with App(cfg) as app:
        _, first = await collect(app, "first", options)
        chunks, second = await collect(app, "second", options)
    assert first.status == second.status == "success", (first.error, second.error)
    views = [c["data"] for c in chunks if c["type"] == "data-views"]
    assert views[0] == {
        "step": 0,
        "all": 3,
        "input": [["user", "second"]],
        "response": [],
        "remembered": [["user", "first"], ["assistant", "one"]],
    }
    assert views[1]["input"] == [["user", "second"]]
    assert views[1]["response"] == [["assistant", None]]  # the tool call's message has no text
    assert views[1]["remembered"] == views[0]["remembered"]


async def test_a_message_in_the_legacy_flat_form_reaches_the_model(data_sidecar: str, node_data: str) -> None:
    cfg = data_config(
        data_sidecar,
        node_data,
        [DONE],
        inputProcessors=[{"processor": "d/legacy", "options": {"text": "flat words"}}],
    )
    async with App(cfg) as app:
        _, result = await collect(app, "hello")
        sent = prompts(app)
    assert result.status == "success", result.error
    users = [p["text"] for m in sent[0] if m["role"] == "user" for p in m["content"]]
    assert users == ["hello", "flat words"]


async def test_a_token_limiter_subclass_counts_and_sees_the_memory_it_trims(
    data_sidecar: str, node_data: str, tmp_path: Path
) -> None:
    limiter = {
        "processor": "d/cursor-limiter",
        "options": {"limit": 500, "trim_mode": "memory-only", "token_counter": "estimate"},
    }
    cfg = data_config(
        data_sidecar,
        node_data,
        [{"text": "one"}, DONE],
        memory={},
        inputProcessors=[limiter],
        top={"storage": {"path": str(tmp_path / "memory.db")}},
    )
    options = CallOptions(thread_id="t1", resource_id="r1", request_context={"tenant": "acme"})
    async with App(cfg) as app:
        _, first = await collect(app, "a heavy question", options)
        _, second = await collect(app, "second", options)
        sent = prompts(app)
        async with ProcessorClient(data_sidecar) as client:
            answer = await client.call("ExecuteTool", ppb.ExecuteToolRequest(tool_name="trims"), 5.0)
    assert first.status == second.status == "success", (first.error, second.error)
    # by the built-in count three short messages fit 500 tokens; by the subclass's the first is 1000
    texts = [p["text"] for m in sent[1] if m["role"] != "system" for p in m["content"]]
    assert texts == [".", "one", "second"]  # a history that starts with an answer gets a "."
    assert convert.from_value(answer.result) == [{"removed": ["a heavy question"], "tenant": "acme"}]
