"""A sidecar whose input guard asks the orchestrator's model gateway for a verdict.

Run as ``python -m tests.e2e.gateway.judge --listen ADDRESS``; the gateway comes from
``PROCMESH_MODEL_GATEWAY`` / ``PROCMESH_MODEL_GATEWAY_KEY``, as in a pod.
"""

from __future__ import annotations

import asyncio
from typing import Any

import procmesh

VERDICT = {
    "type": "object",
    "properties": {"allowed": {"type": "boolean"}},
    "required": ["allowed"],
    "additionalProperties": False,
}


class Judge(procmesh.Processor):
    """Lets the input through only when the judge model says it is allowed."""

    id = "judge"

    async def process_input(
        self, messages: list[dict[str, Any]], model: Any, abort: Any, options: dict[str, Any]
    ) -> list[dict[str, Any]]:
        text = " ".join(
            p.get("text", "") for m in messages for p in m["content"]["parts"] if p.get("type") == "text"
        )
        verdict = await model(options.get("model", "judge")).generate(
            [
                {"role": "system", "content": 'Is this request allowed? Answer {"allowed": true|false}.'},
                {"role": "user", "content": text},
            ],
            schema=VERDICT,
            temperature=0,
        )
        if not verdict.object["allowed"]:
            abort("judge: not allowed", metadata={"attempts": verdict.attempts, "model": verdict.model})
        return messages


class JudgeEach(procmesh.Processor):
    """Asks about every message at once, as the built-in guards do (one GenerateBatch); aborts
    naming the messages not allowed."""

    id = "judge-each"

    async def process_input(
        self, messages: list[dict[str, Any]], model: Any, abort: Any, options: dict[str, Any]
    ) -> list[dict[str, Any]]:
        texts = [
            " ".join(p.get("text", "") for p in m["content"]["parts"] if p.get("type") == "text")
            for m in messages
        ]
        verdicts = await asyncio.gather(
            *(model(options["model"]).generate(text, schema=VERDICT, temperature=0) for text in texts)
        )
        refused = [i for i, v in enumerate(verdicts) if not v.object["allowed"]]
        if refused:
            abort(f"judge-each: not allowed: {refused}")
        return messages


if __name__ == "__main__":
    procmesh.run([Judge(), JudgeEach()])
