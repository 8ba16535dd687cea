"""The service's HTTP room: the reference server's routes (Starlette on uvicorn), one module per
part of the API.

`app.build_http_app` is the route table; `boundary` the layer around it (Host, API keys, limits,
the request metrics); `agents` an agent's runs; `runs` durable runs by id; `probes` /healthz,
/readyz and /metrics; `catalog` and `memory` the client's catalog and memory APIs; `sse` the
server-sent events; `bodies` what every route reads and answers with; `server` uvicorn in the
orchestrator's loop. What a route does to the runs is the API layer's (`service.api`).
"""
