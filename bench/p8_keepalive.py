"""P8: an HTTP request on a kept-alive connection against one on a fresh connection.

A real ``procmesh-orchestrator`` process (the demo model, one operator key) is asked
``POST /api/agents/demo/generate`` by a blocking ``http.client`` in a thread: a batch of requests
on one kept-alive connection, then a batch each on its own new connection, alternating
(`harness.rounds`). The figure is the median of the rounds' ratios of the two p50s. Without
TCP_NODELAY on the server's sockets a kept-alive request waited for the client's delayed ACK
(about 40 ms against 1 ms fresh, issue 24 finding 12); the goal is a kept-alive request as fast
as a fresh one.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
import time
from pathlib import Path

from bench.harness import figure, pct, rounds, start_orchestrator

KEY = "bench-key-0123456789"
_CONFIG = "agents:\n  demo:\n    model: demo\n    errorProcessorDefaults: false\n"
_BODY = json.dumps({"messages": "hello"})
_HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def _request(conn: http.client.HTTPConnection) -> float:
    """Milliseconds of one generate request on `conn`."""
    t0 = time.perf_counter()
    conn.request("POST", "/api/agents/demo/generate", body=_BODY, headers=_HEADERS)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"P8: generate answered {response.status}")
    return (time.perf_counter() - t0) * 1000


def _kept_alive(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        _request(conn)  # the connection is open before the batch
        return [_request(conn) for _ in range(n)]
    finally:
        conn.close()


def _fresh(port: int, n: int) -> list[float]:
    out = []
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            out.append(_request(conn))  # the connect is part of it, as it is for a client
        finally:
            conn.close()
    return out


async def measure(n: int) -> dict[str, object]:
    """p50s of `n` kept-alive and `n` fresh-connection requests per round, and their ratio."""
    with tempfile.TemporaryDirectory(prefix="pm-bench-p8-") as tmp:
        orchestrator = await asyncio.to_thread(start_orchestrator, Path(tmp), _CONFIG, f"{KEY}=@operator")
        port = orchestrator.port
        try:
            samples = await rounds(
                {
                    "kept_alive": lambda: asyncio.to_thread(_kept_alive, port, n),
                    "fresh": lambda: asyncio.to_thread(_fresh, port, n),
                }
            )
        finally:
            await orchestrator.stop()
    kept = [pct(s, 0.5) for s in samples["kept_alive"]]
    fresh = [pct(s, 0.5) for s in samples["fresh"]]
    ratio, spread = figure([k / f for k, f in zip(kept, fresh, strict=True)])
    return {
        "p8_requests_per_batch": n,
        "p8_ms_p50_kept_alive": pct(kept, 0.5),
        "p8_ms_p50_fresh": pct(fresh, 0.5),
        "p8_ratio_kept_alive_vs_fresh": ratio,
        "p8_ratio_kept_alive_vs_fresh_spread": spread,
    }
