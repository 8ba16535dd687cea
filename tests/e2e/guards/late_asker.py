"""A sidecar whose output-stream processor asks the model gateway for a verdict a while after
it was given a part, from a task of its own (as the guards' pipelined verdict tasks do): the
question of an attempt that may have failed by the time it is sent.

Run as ``python -m tests.e2e.guards.late_asker --listen ADDRESS``; the gateway comes from
``PROCMESH_MODEL_GATEWAY`` / ``PROCMESH_MODEL_GATEWAY_KEY``, as in a pod.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel

import procmesh
from procmesh import JudgeSection

log = logging.getLogger(__name__)

VERDICT = {"type": "object", "properties": {"flagged": {"type": "boolean"}}, "required": ["flagged"]}
QUESTION = "Late asker: is this window flagged?"
_TASKS: set[asyncio.Task[None]] = set()
"""The questions being asked (a task outlives the hook call that started it)."""


class LateAskerOptions(BaseModel):
    """Options of `late-asker`."""

    model: str
    delay_ms: float = 400


class LateAsker(procmesh.Processor):
    """On a session's first text delta, asks about it `delay_ms` later; passes every part."""

    id = "late-asker"
    Options = LateAskerOptions

    async def process_output_stream(
        self, part: dict[str, Any], state: dict[str, Any], model: Any, options: LateAskerOptions
    ) -> dict[str, Any]:
        if part["type"] == "text-delta" and not state.get("asked"):
            state["asked"] = True
            task = asyncio.create_task(self._ask(model(options.model), part["payload"]["text"], options))
            _TASKS.add(task)
            task.add_done_callback(_TASKS.discard)
        return part

    async def _ask(self, judge: Any, text: str, options: LateAskerOptions) -> None:
        await asyncio.sleep(options.delay_ms / 1000)
        try:
            await judge.generate(
                [{"role": "system", "content": QUESTION}, {"role": "user", "content": text}],
                schema=VERDICT,
                section=JudgeSection(text, QUESTION, QUESTION, "output"),
            )
        except procmesh.errors.ProcmeshError as exc:
            log.info("late-asker: %s", exc)


if __name__ == "__main__":
    procmesh.run([LateAsker()])
