"""A sidecar whose processor rewrites tool results: what ``execute({phase: "toolResult"})`` runs.

Run as ``python -m tests.e2e.service.redactor_sidecar --listen ADDRESS`` (no example processor
implements process_tool_result).
"""

from __future__ import annotations

from typing import Any

import procmesh


class ResultRedactor(procmesh.Processor):
    """Replaces the ``secret`` key of a tool's object result with ``"[redacted]"``."""

    id = "result-redactor"
    description = "Redacts the secret in tool results."

    async def process_tool_result(self, result: Any) -> Any:
        if isinstance(result, dict) and "secret" in result:
            return {**result, "secret": "[redacted]"}
        return None


if __name__ == "__main__":
    procmesh.run([ResultRedactor()])
