"""procmesh_orchestrator: run Mastra-style agents whose processors live in gRPC sidecars.

The in-process entry point is `App`: build it from a `Config` (`load_config("config.yaml")`),
enter it (it starts and connects to the sidecars), then `app.agent(id).generate(...)` or
`.stream(...)`. The building blocks below it (`Agent`, `AgentSpec`, `GrpcHookCaller`, the model
protocol) are public for embedders and benchmarks; the service (`procmesh-orchestrator`) and the
CLI (`procmesh`) are separate entry points. Errors all derive from `errors.OrchestratorError`.
"""

from procmesh_orchestrator import errors
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, load_config, parse_config
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import GrpcHookCaller, ProcessorHandle, hook_names
from procmesh_orchestrator.run import Agent, AgentSpec, CallOptions, Lanes, RunInfo, RunResult, RunStream
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest, ScriptedModel
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess

__all__ = [
    "Agent",
    "AgentSpec",
    "App",
    "CallOptions",
    "Config",
    "GrpcHookCaller",
    "Lanes",
    "ModelProvider",
    "ModelRequest",
    "OrchestratorMetrics",
    "OrchestratorSettings",
    "ProcessorHandle",
    "RunInfo",
    "RunResult",
    "RunStream",
    "ScriptedModel",
    "SidecarProcess",
    "errors",
    "hook_names",
    "load_config",
    "parse_config",
]
