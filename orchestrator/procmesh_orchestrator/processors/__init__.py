"""The wire to the sidecars: lane entries bound to clients, the gRPC `HookCaller`, the output stream."""

from procmesh_orchestrator.processors.calls import GrpcHookCaller
from procmesh_orchestrator.processors.lanes import (
    Conditional,
    LaneItem,
    ParallelGroup,
    ProcessorHandle,
    RunLaneItem,
    hook_names,
)

__all__ = [
    "Conditional",
    "GrpcHookCaller",
    "LaneItem",
    "ParallelGroup",
    "ProcessorHandle",
    "RunLaneItem",
    "hook_names",
]
