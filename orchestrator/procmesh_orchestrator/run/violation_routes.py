"""Where a violation goes besides the run's result: the seeds' per-processor ``onViolation``.

A processor is remote, so its ``onViolation`` property becomes a route of its lane entry
(`AgentSpec.violation_routes`, by the processor instance id a violation carries): ``log`` (one
WARNING line), ``{webhook: URL}`` (the violation POSTed as JSON, in the background: a slow or
failing hook never holds the run up, its failure is logged and counted), or, in the Python API, a
callable (its exception likewise).
The caller's `CallOptions.on_violation` (one callable, or one per processor id) sees it too; one
that raises is logged and counted as a route's failure is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias

import httpx

log = logging.getLogger(__name__)


class WebhookRoute(Protocol):
    """Where a webhook route posts (the config's ``onViolation: {webhook: URL}`` is one; the run
    stands alone, so it names only what it reads)."""

    @property
    def webhook(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def timeout(self) -> float: ...


Route: TypeAlias = "str | WebhookRoute | Callable[[dict[str, Any]], Any]"
"""``log``, a `WebhookRoute`, or (Python API) a callable given the violation."""

_posting: set[asyncio.Task[None]] = set()
"""Webhook posts in flight (held so they are not collected before they end)."""


def deliver(
    route: Route | None,
    entry: dict[str, Any],
    agent_id: str,
    run_id: str,
    failed: Callable[[], None] = lambda: None,
) -> None:
    """Send one violation (`{processorId, message, detail}`) where `route` says; never raises: a
    webhook or a callable route that fails is logged, and `failed` is called (the run counts it)."""
    if route is None:
        return
    if route == "log":
        log.warning(
            "violation of %s (agent %s, run %s): %s",
            entry["processorId"],
            agent_id,
            run_id,
            entry["message"],
            extra={"run_id": run_id, "detail": entry["detail"]},
        )
    elif callable(route):
        if not call(route, entry):
            failed()
    elif not isinstance(route, str):
        task = asyncio.get_running_loop().create_task(
            _post(route, {"agentId": agent_id, "runId": run_id, **entry}, failed)
        )
        _posting.add(task)
        task.add_done_callback(_posting.discard)


def call(callback: Callable[[dict[str, Any]], Any], entry: dict[str, Any]) -> bool:
    """A Python onViolation callback; its exception is logged, never raised (SPEC §4): False."""
    try:
        callback(entry)
    except Exception:
        log.exception("onViolation callback raised (ignored)")
        return False
    return True


def for_caller(
    callback: Callable[[dict[str, Any]], Any] | Mapping[str, Callable[[dict[str, Any]], Any]] | None,
    entry: dict[str, Any],
    failed: Callable[[], None] = lambda: None,
) -> None:
    """The caller's `CallOptions.on_violation`: every violation, or those of the processor ids it
    maps. One that raises is logged and `failed` is called, as for a route (`deliver`)."""
    if isinstance(callback, Mapping):
        callback = callback.get(entry["processorId"])
    if callback is not None and not call(callback, entry):
        failed()


async def _post(route: WebhookRoute, payload: dict[str, Any], failed: Callable[[], None]) -> None:
    try:
        async with httpx.AsyncClient(timeout=route.timeout) as http:
            response = await http.post(route.webhook, json=payload, headers=route.headers)
            response.raise_for_status()
    except Exception as exc:  # a route's failure is the operator's to see (logged, counted), never the run's
        log.warning("onViolation webhook %s failed for %s: %s", route.webhook, payload["processorId"], exc)
        failed()


async def flush() -> None:
    """Wait for the webhook posts in flight (each ends within its route's timeout)."""
    await asyncio.gather(*_posting, return_exceptions=True)
