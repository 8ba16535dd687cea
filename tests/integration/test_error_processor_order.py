"""The default error processors run in SPEC §5's order, and around the user's own list.

A model error no processor recovers (a 401) is offered to every entry of the error lane, in
order; the decision record (``decisions.record``, a real SQLite store) keeps each
``process_api_error`` call in the order it was made. The defaults run in the built-in sidecar
process the App starts; the user's own processor on a real gRPC server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import APICallError

pytestmark = [pytest.mark.asyncio]

# SPEC §5: the default error processors, in their default order
DEFAULTS = [
    "provider-history-compat",
    "prefill-error-handler",
    "unsupported-file-handler",
    "stream-error-retry-processor",
]


class Mine(Processor):
    """The user's own error processor: it looks at the error and lets the next one try."""

    id = "mine"

    async def process_api_error(self, messages: list[Any]) -> None:
        return None


async def _api_error_order(tmp_path: Path, error_processors: list[str]) -> list[str]:
    async with ProcessorServer([Mine()], ["127.0.0.1:0"]) as sidecar:
        config = parse_config(
            {
                "sidecars": {"s": {"address": sidecar.addresses[0]}},
                "storage": {"path": str(tmp_path / "m.db")},
                "decisions": {"record": True},
                "models": {
                    "m": {
                        "provider": "scripted",
                        "responses": [{"error": {"status": 401, "message": "bad key", "retryable": False}}],
                    }
                },
                "agents": {"a": {"model": "m", "errorProcessors": error_processors}},
            },
            "test config",
        )
        async with App(config) as app:
            with pytest.raises(APICallError, match="bad key"):
                await app.agent("a").generate("hi")
            assert app.store is not None
            recorded = await app.store.decisions_between("2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z")
    return [d.processor for d in recorded if d.hook == "process_api_error"]


async def test_the_default_error_processors_run_in_the_spec_order(tmp_path: Path) -> None:
    assert await _api_error_order(tmp_path, []) == DEFAULTS


async def test_the_defaults_a_list_lacks_are_placed_around_it_by_the_default_order(tmp_path: Path) -> None:
    # the user's list keeps its order; each missing default goes before the first listed default
    # that comes later in the default order (here the user's own stream-error-retry-processor)
    order = await _api_error_order(tmp_path, ["s/mine", "builtins/stream-error-retry-processor"])
    assert order == ["mine", *DEFAULTS]
