"""The composition root: `App` serves one bound config (a `Pipeline`) at a time, with the
built-in sidecar, the store and durable runs around it; a reload (`ConfigReloader`) swaps in the
next pipeline without a restart."""

from procmesh_orchestrator.app._app import App, needs_builtins, secret_variables
from procmesh_orchestrator.app._pipeline import Pipeline, config_hash

__all__ = ["App", "Pipeline", "config_hash", "needs_builtins", "secret_variables"]
