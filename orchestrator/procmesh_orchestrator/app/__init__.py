"""The composition root: `App` serves one bound config (a `Pipeline`) at a time, with the
built-in sidecar, the store and durable runs around it; a reload (`ConfigReloader`) swaps in the
next pipeline without a restart."""

from procmesh_orchestrator.app._app import App, needs_builtins, secret_variables
from procmesh_orchestrator.app._pipeline import Pipeline, config_hash
from procmesh_orchestrator.app._reload import RESTART_ONLY, ConfigReloader, restart_only_changes

__all__ = [
    "RESTART_ONLY",
    "App",
    "ConfigReloader",
    "Pipeline",
    "config_hash",
    "needs_builtins",
    "restart_only_changes",
    "secret_variables",
]
