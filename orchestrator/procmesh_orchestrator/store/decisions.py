"""The decision record: every processor decision of a run, kept with the run (issue 31).

A run collects its decisions in memory (`processors.decisions.DecisionLog`, an append per call or
stream part) and hands them to the store in one write at its end or suspension
(`DecisionStore.save_decisions`), which also drops what is older than the retention. What a
processor saw is kept as a hash; its content only when the operator turns content recording on
(``decisions.recordContent``). Deleting a thread deletes its runs' decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

OUTCOMES = ("pass", "rewrite", "drop", "abort", "retry", "failed_open", "failed", "input_refused", "monitor")
"""A decision's outcome: what the run applied (pass, rewrite, drop for a stream part, abort, retry),
a failure (let through: failed_open; failed the run: failed, input_refused) or monitor (an entry in
``mode: monitor``: nothing applied, `Decision.would` says what it would have done)."""


@dataclass(slots=True)
class Decision:
    """One processor call's (or stream part's) decision in a run."""

    run_id: str
    agent_id: str
    processor: str
    sidecar: str
    entry: str
    hook: str
    step: int
    outcome: str
    at: str
    """When it was decided: ISO 8601, UTC (``2026-12-05T09:08:17.123456Z`` is stored as given)."""
    latency_ms: float = 0.0
    part: int | None = None
    """The part's offset in its output-stream session (None: a unary hook)."""
    would: str = ""
    """An entry in monitor mode: what it would have done (pass, rewrite, drop, abort, retry)."""
    seen: str = ""
    """A hash (SHA-256, hex) of what the processor was given, its run context aside."""
    content: str | None = None
    """What it was given, as JSON: only with content recording on."""
    thread_id: str = ""
    resource_id: str = ""

    def to_json(self) -> dict[str, Any]:
        """The API's form (camelCase), the run's ids aside."""
        out = asdict(self)
        for key in ("run_id", "thread_id", "resource_id"):
            out.pop(key)
        out["agentId"] = out.pop("agent_id")
        out["latencyMs"] = out.pop("latency_ms")
        return out


INPUT_KINDS = (
    "input", "request-context", "memory-context", "model-prompt", "model-output", "tool-output",
    "tool-results", "truncated",
)  # fmt: skip
"""What a recorded input is: the run's input, its request context, what memory made of its
prompt (system messages, the messages once the history loaded, memory's tools, its token budget:
`run.framework.memory.MessageHistory`), a model call's prompt hash
(``{"sha256"}``, `ModelRequest.digest`) and raw output (before any processor), a tool call's own
answer (before processToolResult: ``result`` and ``modelOutput``, or ``error``), a step's tool
results (as the run gave them on); ``truncated`` marks where the run's size bound stopped the
recording."""


@dataclass(slots=True)
class RecordedInput:
    """Something a run was given, kept for replay (``agents.ID.recordInputs``)."""

    run_id: str
    agent_id: str
    kind: str
    step: int
    body: str
    """JSON."""
    at: str
    thread_id: str = ""
    resource_id: str = ""


class DecisionStore(Protocol):
    """Runs' decision records and recorded inputs."""

    async def save_decisions(
        self,
        decisions: Sequence[Decision],
        *,
        retention_seconds: float,
        inputs: Sequence[RecordedInput] = (),
    ) -> None:
        """Add a run's decisions and recorded inputs in one transaction, dropping every decision
        and input (of any run) recorded more than `retention_seconds` ago."""

    async def run_inputs(self, run_id: str) -> list[RecordedInput]:
        """A run's recorded inputs in the order they came ([] when none are kept)."""

    async def run_decisions(self, run_id: str) -> list[Decision]:
        """A run's decisions in the order they were made ([] for a run with none)."""

    async def decisions_between(
        self, since: str, until: str, *, agent_id: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[Decision]:
        """Decisions made from `since` to before `until` (ISO 8601), oldest first, at most `limit`
        (at most `MAX_PAGE`) after the first `offset`."""

    async def recorded_runs(
        self, since: str, until: str, *, agent_id: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[str]:
        """The ids of runs whose inputs were recorded from `since` to before `until` (ISO 8601),
        oldest first, at most `limit` (at most `MAX_PAGE`) after the first `offset`: what a replay
        of a time range replays."""
