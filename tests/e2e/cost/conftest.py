"""The cost-control tests reuse the service tests' `start_orchestrator` fixture, and the gateway
tests' judge sidecar and pinned gRPC port (`test_cost_judge`)."""

from tests.e2e.gateway.conftest import gateway_port, judge_sidecar
from tests.e2e.service.conftest import start_orchestrator

__all__ = ["gateway_port", "judge_sidecar", "start_orchestrator"]
