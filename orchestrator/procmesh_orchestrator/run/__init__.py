"""One run's semantics: the loop, retries, tools and messages; it speaks to processors through
`hooks.HookCaller` and to models through `models.ModelProvider`, never to a wire."""

from procmesh_orchestrator.run.agent import Agent, RunStream
from procmesh_orchestrator.run.hooks import CallerFactory, HookCaller, RunInfo
from procmesh_orchestrator.run.types import AgentSpec, CallOptions, Lanes, RunResult

__all__ = [
    "Agent",
    "AgentSpec",
    "CallOptions",
    "CallerFactory",
    "HookCaller",
    "Lanes",
    "RunInfo",
    "RunResult",
    "RunStream",
]
