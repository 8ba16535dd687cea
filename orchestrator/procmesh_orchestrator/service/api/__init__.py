"""The service's transport-neutral room: what a request means, whatever carries it.

Requests validated into calls (`calls`, with the options both APIs share in `call_options`, the
body's memory in `call_memory`, and `messages`), approve / decline / resume bodies (`resume`),
results and chunks in the reference's shapes (`results`), the state both APIs serve from (`core`:
`ServiceCore`), the run registry (`runs`: the run gate, the runs streaming here, resuming a
suspended run) and run control once for both transports (`control`: admit, stream, resume,
observe, cancel), durable runs (`durable`), the sidecars' processors and per-call lanes
(`processors`), the catalog (`catalog`) and memory (`memory`). The HTTP room (`service.http`) and
the gRPC room (`service.grpc`) import from here; nothing here imports them.
"""
