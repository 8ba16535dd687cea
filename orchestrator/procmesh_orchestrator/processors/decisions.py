"""A run's decision record as it runs: `DecisionLog`, filled where each call's outcome is
classified (`calls.HookAttempt.settle`, the failure policy, an output-stream session's parts) and
written to the store in one transaction at the run's end or suspension (`store.decisions`).

The hot path pays one tuple appended to a list per decision, and per unary request one hash of
what was sent (its run context aside: ids, states and counters are not what the processor judged).
Content is kept only with ``decisions.recordContent``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.metrics import Series
from procmesh_orchestrator.store.decisions import Decision, DecisionStore

log = logging.getLogger(__name__)


class DecisionsConfig(BaseModel):
    """The configuration's ``decisions`` section: whether runs keep a decision record, with what."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    record: bool = False
    """Keep every processor decision of every run in the `storage` store."""
    record_content: bool = False
    """Keep what each processor was given (JSON) beside its hash: user content in the store."""
    retention_days: float = Field(default=7.0, gt=0)
    """Decisions older than this are purged (as later runs write theirs)."""


_SECONDS: dict[int, str] = {}
"""The text of the last second `_stamp` formatted (a run's decisions share a few seconds)."""


def _stamp(at: float) -> str:
    """`time.time()` as the store keeps times (ISO 8601, UTC, to the microsecond), without a
    datetime per decision."""
    second = int(at)
    head = _SECONDS.get(second)
    if head is None:
        _SECONDS.clear()
        head = _SECONDS[second] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{head}.{int((at - second) * 1e6):06d}Z"


def _json(message: Message) -> str:
    return json_format.MessageToJson(message, indent=None, preserving_proto_field_name=True)


class DecisionLog:
    """One run's decisions, kept in memory until `flush`."""

    def __init__(self, config: DecisionsConfig) -> None:
        self.config = config
        self._items: list[tuple[Any, ...]] = []

    def seen(self, request: Message) -> tuple[str, str | None]:
        """A request's hash (SHA-256 of its fields but the run context) and, with content
        recording on, those fields as JSON."""
        clone = type(request)()
        clone.CopyFrom(request)
        if "context" in clone.DESCRIPTOR.fields_by_name:
            clone.ClearField("context")
        digest = hashlib.sha256(clone.SerializeToString(deterministic=True)).hexdigest()
        return digest, _json(clone) if self.config.record_content else None

    def part_seen(self, part: Message) -> tuple[str, str | None]:
        """An output-stream part's hash and (content recording on) JSON."""
        digest = hashlib.sha256(part.SerializeToString(deterministic=True)).hexdigest()
        return digest, _json(part) if self.config.record_content else None

    def add(
        self,
        labels: Series,
        hook: str,
        step: int,
        outcome: str,
        *,
        took: float = 0.0,
        seen: tuple[str, str | None] = ("", None),
        would: str = "",
        part: int | None = None,
    ) -> None:
        """Record one decision (`store.decisions.OUTCOMES`); `took` in seconds."""
        self._items.append((labels, hook, step, outcome, took, seen, would, part, time.time()))

    async def flush(
        self, run_id: str, thread_id: str, resource_id: str, store: Callable[[], Awaitable[DecisionStore]]
    ) -> None:
        """Write what was recorded since the last flush, in one transaction. A store that fails is
        logged: the run's own result does not depend on its record."""
        items, self._items = self._items, []
        if not items:
            return
        decisions = [
            Decision(
                run_id=run_id,
                agent_id=agent,
                processor=processor,
                sidecar=sidecar,
                entry=entry,
                hook=hook,
                step=step,
                outcome=outcome,
                at=_stamp(at),
                latency_ms=took * 1000,
                part=part,
                would=would,
                seen=seen[0],
                content=seen[1],
                thread_id=thread_id,
                resource_id=resource_id,
            )
            for (agent, sidecar, processor, entry), hook, step, outcome, took, seen, would, part, at in items
        ]
        try:
            target = await store()
            await target.save_decisions(decisions, retention_seconds=self.config.retention_days * 86400)
        except Exception:
            log.exception("run %s: its %d decisions could not be recorded", run_id, len(decisions))
