"""How the output pipeline plans its sessions: fused neighbours, speculative groups (no sockets)."""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import struct_pb2

from procmesh import ProcessorClient
from procmesh_orchestrator.processors.calls import GrpcHookCaller
from procmesh_orchestrator.processors.lanes import ParallelGroup, ProcessorHandle
from procmesh_orchestrator.processors.stream import OutputPipeline
from procmesh_orchestrator.run.hooks import RunInfo

HOOK = "process_output_stream"


def handle(pid: str, sidecar: str, *, speculative: bool = True, **kw: Any) -> ProcessorHandle:
    return ProcessorHandle(
        key=pid,
        processor_id=pid,
        client=cast(ProcessorClient, object()),  # never called: only the plan is looked at
        options=struct_pb2.Struct(),
        hooks=frozenset({HOOK}),
        process_data_parts=False,
        timeout=5.0,
        on_failure=kw.pop("on_failure", "fail-closed"),
        speculative=speculative,
        fuse_key=sidecar,
        **kw,
    )


class _Caller:
    def __init__(self, fuse: bool) -> None:
        self.info = RunInfo(run_id="r", agent_id="a", request_context={}, fuse=fuse)


def plan(items: list[Any], *, fuse: bool = True) -> list[Any]:
    pipeline = OutputPipeline(cast(GrpcHookCaller, _Caller(fuse)), items, announce_signals=False)
    return [
        ([[h.processor_id for h in session] for session in sessions], side)
        for sessions, side in pipeline.stages
    ]


def test_neighbours_of_one_sidecar_share_a_session_and_sessions_speculate() -> None:
    lane = [handle("a", "s"), handle("b", "s"), handle("c", "t"), handle("d", "u")]
    assert plan(lane) == [([["a", "b"], ["c"], ["d"]], None)]
    assert plan(lane, fuse=False) == [([["a"], ["b"], ["c"], ["d"]], None)]


def test_a_processor_that_is_not_speculative_ends_the_group() -> None:
    lane = [handle("a", "s"), handle("b", "t"), handle("g", "u", speculative=False), handle("c", "v")]
    assert plan(lane) == [([["a"], ["b"]], None), ([["g"]], False), ([["c"]], False)]


def test_a_non_speculative_processor_is_fused_only_after_fail_open_ones() -> None:
    lane = [handle("a", "s"), handle("g", "s", speculative=False)]
    assert plan(lane) == [([["a"]], False), ([["g"]], False)]
    lane = [handle("a", "s", on_failure="fail-open"), handle("g", "s", speculative=False)]
    assert plan(lane) == [([["a", "g"]], False)]


def test_shadow_processors_and_parallel_branches_keep_their_own_session() -> None:
    shadow = handle("x", "", shadow=True)  # the App gives a shadow processor no fuse key
    group = ParallelGroup(key="w", processor_id="w", branches=(handle("p", "s"), handle("q", "s")), pick=1)
    lane = [handle("a", "s"), shadow, handle("b", "t"), group]
    assert plan(lane) == [
        ([["a"]], False),
        ([["x"]], False),
        ([["b"]], False),
        ([["p"]], True),
        ([["q"]], False),
    ]


def test_cheap_first_a_judge_is_not_grouped_behind_cheap_checks() -> None:
    lane = [handle("regex", "s"), handle("tokens", "t"), handle("mod", "u", judged=True), handle("x", "v")]
    assert plan(lane) == [([["regex"], ["tokens"]], None), ([["mod"], ["x"]], None)]
    # a judge in front: the group keeps everything after it (no judge waits for another)
    lane = [handle("mod", "u", judged=True), handle("regex", "s"), handle("pii", "t", judged=True)]
    assert plan(lane) == [([["mod"], ["regex"], ["pii"]], None)]


def test_a_processor_id_is_in_a_group_once() -> None:
    lane = [handle("a", "s"), handle("b", "t"), handle("a", "u")]
    assert plan(lane) == [([["a"], ["b"]], None), ([["a"]], False)]
