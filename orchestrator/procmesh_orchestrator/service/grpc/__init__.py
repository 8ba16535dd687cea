"""The service's gRPC room: procmesh.v1.AgentService (`servicer`, its requests and responses), the
model gateway (procmesh.v1.ModelService: `model_gateway`, its access and model policy in
`gateway_policy`, its model calls in `gateway_calls`, its typed verdicts in `gateway_judging` with
`judge_planner`, `judge_sections`, `verdict_cache` and `run_judging`), the interceptor that guards
them (`guard`) and the server (`server`: with grpc.health.v1 and reflection). What an RPC does to
the runs is the API layer's (`service.api`).

Imported by its absolute name only (``procmesh_orchestrator.service.grpc``): ``import grpc`` in
its modules is the grpc library.
"""
