"""The service's transport-neutral room: what a request means, whatever carries it.

Requests validated into calls (`calls`, `messages`), results and chunks in the reference's shapes
(`results`), the run registry and run control (`runs`: the run gate, the runs streaming here,
resume and cancel), durable runs (`durable`), and the state both APIs serve from (`core`). The HTTP
room (`service.http`) and the gRPC room (`service.grpc`) import from here; nothing here imports them.
"""
