"""`batch-parts`: combines streamed text deltas into fewer, larger chunks.

Limits of the current contract (see docs/builtins.md): a hook returns one chunk
per part and there is no end-of-stream call, and the orchestrator does not pass
a step's ``finish`` chunk through ``processOutputStream``. So a batch still open
when a step's stream ends is emitted with the next batch (in a later step), or
never after the last step; and a non-text part arriving behind buffered text is
emitted at once, ahead of that text (the reference flushes the text first).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from procmesh import Processor
from procmesh_sidecars.builtins._common import Chunk


class BatchPartsOptions(BaseModel):
    """Options of `batch-parts`."""

    batch_size: int = Field(default=5, ge=1)
    """Parts per emitted batch."""
    max_wait_time: float | None = Field(default=None, gt=0)
    """Milliseconds a batch may wait; once passed, the batch is flushed with the next part."""
    emit_on_non_text: bool = True
    """Flush the batch when a non-text part arrives (the part follows right after)."""


_LOOP_PARTS = ("tool-call", "tool-result", "tool-error")
"""Parts the loop acts on: never held back (a held tool call would never run)."""


_STEP_ENDS = ("step-finish", "finish")
"""A step's end: everything still batched is emitted before it."""


def flush_all(state: dict[str, Any]) -> list[Chunk]:
    """Everything batched, in order (text runs combined)."""
    out: list[Chunk] = []
    while (chunk := flush_batch(state)) is not None:
        out.append(chunk)
    return out


def flush_batch(state: dict[str, Any]) -> Chunk | None:
    """Emit the batch: a leading non-text part alone, else the leading run of text deltas combined."""
    batch: list[Chunk] = state.get("batch") or []
    state.pop("firstAt", None)
    if not batch:
        return None
    if len(batch) == 1 or batch[0].get("type") != "text-delta":
        state["batch"] = batch[1:]
        return batch[0]
    end = 0
    while end < len(batch) and batch[end].get("type") == "text-delta":
        end += 1
    first = batch[0]
    text = "".join(str((c.get("payload") or {}).get("text", "")) for c in batch[:end])
    payload = {"text": text}
    if (first.get("payload") or {}).get("id"):
        payload["id"] = first["payload"]["id"]
    state["batch"] = batch[end:]
    return {**first, "payload": payload}


class BatchParts(Processor):
    """Buffers text deltas and emits them in batches."""

    id = "batch-parts"
    name = "Batch Parts"
    description = "Batches streamed text deltas into fewer chunks (batch_size, max_wait_time)."
    Options = BatchPartsOptions

    async def process_output_stream(
        self, part: Chunk, options: BatchPartsOptions, state: dict[str, Any]
    ) -> Chunk | list[Chunk] | None:
        state.setdefault("batch", [])
        kind = str(part.get("type", ""))
        if kind in _STEP_ENDS or (kind != "text-delta" and (options.emit_on_non_text or kind in _LOOP_PARTS)):
            # the batch goes first, then the part (a held tool call would never run; at a step's
            # end nothing may stay behind)
            flushed = flush_all(state)
            return [*flushed, part] if flushed else part
        first_at = state.get("firstAt")
        timed_out = (
            options.max_wait_time is not None
            and first_at is not None
            and (time.time() - float(first_at)) * 1000 >= options.max_wait_time
        )
        state["batch"].append(part)
        if timed_out or len(state["batch"]) >= options.batch_size:
            return flush_batch(state)
        if state.get("firstAt") is None:
            state["firstAt"] = time.time()
        return None
