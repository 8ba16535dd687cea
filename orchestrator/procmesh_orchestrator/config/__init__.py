"""The orchestrator's YAML configuration: schema (pydantic, errors name the key) and loading."""

from procmesh_orchestrator.config.agents import AgentConfig
from procmesh_orchestrator.config.lanes import (
    ConditionalStep,
    LaneEntry,
    ParallelStep,
    ProcessorRef,
    WorkflowConfig,
    WorkflowRef,
    WorkflowStep,
    workflow_refs,
)
from procmesh_orchestrator.config.loading import ENV_PREFIX, apply_env_overrides, load_config, parse_config
from procmesh_orchestrator.config.providers import DEFAULT_PROVIDERS, ModelConfig, ProviderConfig
from procmesh_orchestrator.config.schema import Config
from procmesh_orchestrator.config.sidecars import BUILTINS, SidecarConfig, TLSConfig
from procmesh_orchestrator.config.tools import FailurePolicy, McpServerConfig, ToolConfig

__all__ = [
    "BUILTINS",
    "DEFAULT_PROVIDERS",
    "ENV_PREFIX",
    "AgentConfig",
    "ConditionalStep",
    "Config",
    "FailurePolicy",
    "LaneEntry",
    "McpServerConfig",
    "ModelConfig",
    "ParallelStep",
    "ProcessorRef",
    "ProviderConfig",
    "SidecarConfig",
    "TLSConfig",
    "ToolConfig",
    "WorkflowConfig",
    "WorkflowRef",
    "WorkflowStep",
    "apply_env_overrides",
    "load_config",
    "parse_config",
    "workflow_refs",
]
