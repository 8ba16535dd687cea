"""The orchestrator as a service: HTTP and gRPC agent APIs, health, metrics and a graceful drain.

`serve()` is what ``procmesh-orchestrator`` runs; `Service` is the same thing as an
async context manager (tests, embedding).
"""

from procmesh_orchestrator.service._service import Service, serve

__all__ = ["Service", "serve"]
