"""The cost-control tests reuse the service tests' `start_orchestrator` fixture."""

from tests.e2e.service.conftest import start_orchestrator

__all__ = ["start_orchestrator"]
