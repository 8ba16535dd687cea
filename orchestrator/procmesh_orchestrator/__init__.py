"""procmesh_orchestrator: run Mastra-style agents whose processors live in gRPC sidecars.

The in-process entry point is `App`: build it from a `Config` (`load_config("config.yaml")`),
enter it (it starts and connects to the sidecars), then `app.agent(id).generate(...)` or
`.stream(...)` with `CallOptions` (`ClientTool`, `StructuredOutput`, `StepCountIs` and
`HasToolCall` are what its fields take). The building blocks below it (`Agent`, `AgentSpec`,
`ProcessorHandle`, the model protocol) are public for embedders and benchmarks; the service
(`procmesh-orchestrator`) and the CLI (`procmesh`) are separate entry points. Errors all derive
from `errors.OrchestratorError`.

The names load on first use (PEP 562), so importing a room of the package
(``import procmesh_orchestrator.run``) does not bring in the app, the wire or the service.
`_EXPORTS` says where each name lives; the `TYPE_CHECKING` block repeats it for type checkers
(tests/unit/orchestrator/test_exports.py keeps the two equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procmesh_orchestrator import errors
    from procmesh_orchestrator.app import App
    from procmesh_orchestrator.config import Config, load_config, parse_config
    from procmesh_orchestrator.config.cost import CostGuardProcessor, TokenCostControl
    from procmesh_orchestrator.metrics import OrchestratorMetrics
    from procmesh_orchestrator.processors import ProcessorHandle
    from procmesh_orchestrator.providers.builtin import ScriptedModel
    from procmesh_orchestrator.run import Agent, AgentSpec, CallOptions, Lanes, RunInfo, RunResult, RunStream
    from procmesh_orchestrator.run.background import BackgroundOptions, BackgroundTool
    from procmesh_orchestrator.run.framework.history_budget import HistoryBudget
    from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
    from procmesh_orchestrator.run.framework.prepare_step import StepContext, StepOverride, StepRule
    from procmesh_orchestrator.run.function_tool import FunctionTool, FunctionToolContext
    from procmesh_orchestrator.run.models import ModelProvider, ModelRequest
    from procmesh_orchestrator.run.stop import HasToolCall, StepCountIs, StopCondition
    from procmesh_orchestrator.run.tools import ClientTool
    from procmesh_orchestrator.run.types import StructuredOutput
    from procmesh_orchestrator.settings import OrchestratorSettings
    from procmesh_orchestrator.sidecar_process import SidecarProcess

__all__ = [
    "Agent",
    "AgentSpec",
    "App",
    "BackgroundOptions",
    "BackgroundTool",
    "CallOptions",
    "ClientTool",
    "Config",
    "CostGuardProcessor",
    "FunctionTool",
    "FunctionToolContext",
    "HasToolCall",
    "HistoryBudget",
    "Lanes",
    "MemoryCallOptions",
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
    "StepContext",
    "StepCountIs",
    "StepOverride",
    "StepRule",
    "StopCondition",
    "StructuredOutput",
    "TokenCostControl",
    "errors",
    "load_config",
    "parse_config",
]

_EXPORTS = {
    "Agent": "procmesh_orchestrator.run",
    "AgentSpec": "procmesh_orchestrator.run",
    "App": "procmesh_orchestrator.app",
    "BackgroundOptions": "procmesh_orchestrator.run.background",
    "BackgroundTool": "procmesh_orchestrator.run.background",
    "CallOptions": "procmesh_orchestrator.run",
    "ClientTool": "procmesh_orchestrator.run.tools",
    "Config": "procmesh_orchestrator.config",
    "CostGuardProcessor": "procmesh_orchestrator.config.cost",
    "FunctionTool": "procmesh_orchestrator.run.function_tool",
    "FunctionToolContext": "procmesh_orchestrator.run.function_tool",
    "HasToolCall": "procmesh_orchestrator.run.stop",
    "HistoryBudget": "procmesh_orchestrator.run.framework.history_budget",
    "Lanes": "procmesh_orchestrator.run",
    "MemoryCallOptions": "procmesh_orchestrator.run.framework.memory",
    "ModelProvider": "procmesh_orchestrator.run.models",
    "ModelRequest": "procmesh_orchestrator.run.models",
    "OrchestratorMetrics": "procmesh_orchestrator.metrics",
    "OrchestratorSettings": "procmesh_orchestrator.settings",
    "ProcessorHandle": "procmesh_orchestrator.processors",
    "TokenCostControl": "procmesh_orchestrator.config.cost",
    "RunInfo": "procmesh_orchestrator.run",
    "RunResult": "procmesh_orchestrator.run",
    "RunStream": "procmesh_orchestrator.run",
    "ScriptedModel": "procmesh_orchestrator.providers.builtin",
    "SidecarProcess": "procmesh_orchestrator.sidecar_process",
    "StepContext": "procmesh_orchestrator.run.framework.prepare_step",
    "StepCountIs": "procmesh_orchestrator.run.stop",
    "StepOverride": "procmesh_orchestrator.run.framework.prepare_step",
    "StepRule": "procmesh_orchestrator.run.framework.prepare_step",
    "StopCondition": "procmesh_orchestrator.run.stop",
    "StructuredOutput": "procmesh_orchestrator.run.types",
    "errors": "procmesh_orchestrator",
    "load_config": "procmesh_orchestrator.config",
    "parse_config": "procmesh_orchestrator.config",
}
"""Where each public name lives (``procmesh_orchestrator``: the name is a submodule)."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for (then kept)."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'procmesh_orchestrator' has no attribute {name!r}")
    if where == __name__:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
