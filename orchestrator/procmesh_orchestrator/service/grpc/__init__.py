"""The service's gRPC room: procmesh.v1.AgentService, the model gateway (procmesh.v1.ModelService),
grpc.health.v1 and reflection, on the orchestrator's gRPC server.

Imported by its absolute name only (``procmesh_orchestrator.service.grpc``): ``import grpc`` in
its modules is the grpc library.
"""
