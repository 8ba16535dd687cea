"""A run's decision record as it runs: `DecisionLog`, filled where each call's outcome is
classified (`attempts.HookAttempt.settle`, the failure policy, an output-stream session's parts) and
written to the store in one transaction at the run's end or suspension (`store.decisions`).

The hot path pays one tuple appended to a list per decision, and per unary request one hash of
what was sent (its run context aside: ids, states and counters are not what the processor judged).
Content is kept only with ``decisions.recordContent``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.metrics import Series
from procmesh_orchestrator.store.decisions import Decision, DecisionStore, RecordedInput

log = logging.getLogger(__name__)


class DecisionsConfig(BaseModel):
    """The configuration's ``decisions`` section: whether runs keep a decision record, with what."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    record: bool = False
    """Keep every processor decision of every run in the `storage` store."""
    record_content: bool = False
    """Keep what each processor was given (JSON) beside its hash: user content in the store."""
    retention_days: float = Field(default=7.0, gt=0)
    """Decisions (and recorded inputs) older than this are purged (as later runs write theirs)."""
    max_input_bytes: int = Field(default=1_000_000, ge=1)
    """The most a run's recorded inputs keep (``agents.ID.recordInputs``), as JSON; past it, a
    ``truncated`` mark and nothing more."""


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

    def __init__(self, config: DecisionsConfig, *, inputs: bool = False) -> None:
        self.config = config
        self._items: list[tuple[Any, ...]] = []
        self.inputs = inputs
        """Whether the run's inputs are recorded too (`keep`)."""
        self._kept: list[tuple[str, int, str, float]] = []
        self._room = config.max_input_bytes

    def keep(self, kind: str, step: int, body: Any) -> None:
        """Record something the run was given, for replay (`store.decisions.INPUT_KINDS`), as
        JSON, while the run's size bound has room; past it, one ``truncated`` mark."""
        if not self.inputs or self._room < 0:
            return
        text = json.dumps(body, ensure_ascii=False, default=str)
        self._room -= len(text.encode())
        if self._room < 0:
            kind, text = "truncated", json.dumps({"kind": kind, "maxInputBytes": self.config.max_input_bytes})
        self._kept.append((kind, step, text, time.time()))

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

    def take(
        self, run_id: str, agent_id: str, thread_id: str = "", resource_id: str = ""
    ) -> tuple[list[Decision], list[RecordedInput]]:
        """What was recorded since the last `take`, as the store keeps it (a replay reads its
        candidate's decisions here instead of writing them)."""
        items, self._items = self._items, []
        kept, self._kept = self._kept, []
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
        inputs = [
            RecordedInput(run_id, agent_id, kind, step, text, _stamp(at), thread_id, resource_id)
            for kind, step, text, at in kept
        ]
        return decisions, inputs

    async def flush(
        self,
        run_id: str,
        agent_id: str,
        thread_id: str,
        resource_id: str,
        store: Callable[[], Awaitable[DecisionStore]],
    ) -> bool:
        """Write what was recorded since the last flush, in one transaction. A store that fails is
        logged, and False returned for the run to count: the run's own result does not depend on
        its record."""
        decisions, inputs = self.take(run_id, agent_id, thread_id, resource_id)
        if not decisions and not inputs:
            return True
        try:
            target = await store()
            retention = self.config.retention_days * 86400
            await target.save_decisions(decisions, retention_seconds=retention, inputs=inputs)
        except Exception:
            log.exception("run %s: its decision record could not be written", run_id)
            return False
        return True
