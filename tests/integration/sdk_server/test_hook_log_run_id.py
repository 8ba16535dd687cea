"""A hook's, a stream hook's and a hosted tool's log lines name the run they serve (``run_id`` in
``--log-format json``), as the orchestrator's and the Node SDK's do: the servicer sets `RUN_ID`
from the request's context where the call's task starts. A real ProcessorServer over gRPC."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from procmesh import JsonFormatter, Processor, Tool, ToolContext, convert
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

pytestmark = pytest.mark.asyncio(loop_scope="module")

log = logging.getLogger("tests.hook_log_run_id")


class Logging(Processor):
    id = "logging"

    async def process_input(self) -> None:
        log.info("in process_input")

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        log.info("in process_output_stream")
        return part


class Echo(Tool):
    name = "echo"
    description = "Logs and answers."

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        log.info("in the tool")
        return args


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)


def context(run_id: str) -> tpb.RunContext:
    return tpb.RunContext(processor_id="logging", run_id=run_id, agent_id="a")


async def test_each_calls_log_lines_name_its_run(lines: Lines) -> None:
    async with serve_for_test([Logging()], tools=[Echo()]) as client:
        await client.call("ProcessInput", ppb.ProcessInputRequest(context=context("run-unary")), 5)
        call = client.open_stream(5)
        part = convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": "a"}})
        await call.write(
            ppb.ProcessOutputStreamRequest(
                context=context("run-stream"), parts=[ppb.StreamPart(seq=1, part=part)]
            )
        )
        await call.read()
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # its end (the state)
            pass
        tool = ppb.ExecuteToolRequest(
            context=tpb.RunContext(run_id="run-tool"), tool_name="echo", args=convert.to_value({"x": 1})
        )
        await client.call("ExecuteTool", tool, 5)
    seen = {line["message"]: line.get("run_id") for line in lines.lines}
    assert seen == {
        "in process_input": "run-unary",
        "in process_output_stream": "run-stream",
        "in the tool": "run-tool",
    }
