"""The orchestrator's Prometheus collectors (no user content in any label).

Every processor series is labelled ``agent``, ``sidecar`` (the config's sidecar name),
``processor`` (the processor id the sidecar hosts it under) and ``entry`` (the lane entry's
``name``, else the processor id: the name a run knows it by, unique in an agent), so two sidecars
hosting one processor id, or two agents using one, are separate series. Every value comes from the
config (no run, thread or user value): the number of series is bounded by the config's entries.
A processor the orchestrator runs itself (``token-cost-control``) has ``sidecar="orchestrator"``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PART_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

OWN_SIDECAR = "orchestrator"
"""The ``sidecar`` label of a processor the orchestrator runs in itself (token-cost-control)."""

Source = tuple[str, str]
"""Where a lane entry runs: (its sidecar's name, the processor id it is hosted under)."""

Series = tuple[str, str, str, str]
"""A processor's labels: (agent, sidecar, processor, entry)."""

PROCESSOR_LABELS = ["agent", "sidecar", "processor", "entry"]

MONITOR_DECISIONS = ("pass", "abort", "retry", "rewrite", "drop")
"""What a processor in ``mode: monitor`` would have done (``would`` of procmesh_monitor_decisions_total)."""


def series(agent: str, entry: str, source: Source | None) -> Series:
    """The labels of the lane entry `entry` of `agent` running at `source` (None: in the orchestrator)."""
    sidecar, processor = source if source is not None else (OWN_SIDECAR, entry)
    return (agent, sidecar, processor or entry, entry)


class OrchestratorMetrics:
    """Counters and histograms of runs, processor calls, tripwires, retries and chunks."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # Label children of the per-call series, kept: `labels()` takes a lock and builds its key
        # on every call (two per unary hook call, bench P1); none of these series is ever removed.
        self._calls: dict[tuple[str, ...], Any] = {}
        self._took: dict[tuple[str, ...], Any] = {}
        self.processor_calls = Counter(
            "procmesh_processor_calls_total",
            "Processor hook calls by outcome (ok, abort, failed, failed_open, input_refused; monitor for "
            "an entry in mode monitor); an output-stream session counts once.",
            [*PROCESSOR_LABELS, "hook", "outcome"],
            registry=r,
        )
        self.processor_call_duration = Histogram(
            "procmesh_processor_call_duration_seconds",
            "Unary processor hook calls as the orchestrator sees them (network included).",
            [*PROCESSOR_LABELS, "hook"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.speculative_calls = Counter(
            "procmesh_speculative_calls_total",
            "Hook calls sent before their input was final, by outcome: committed (the input held) "
            "or discarded (an earlier processor changed it, or aborted).",
            [*PROCESSOR_LABELS, "hook", "outcome"],
            registry=r,
        )
        self.monitor_decisions = Counter(
            "procmesh_monitor_decisions_total",
            "Decisions of processors in mode monitor (recorded, not enforced), by what each would have "
            "done: pass, abort (block), retry, rewrite, drop.",
            [*PROCESSOR_LABELS, "hook", "would"],
            registry=r,
        )
        self.processor_failures_let_through = Counter(
            "procmesh_processor_failures_let_through_total",
            "Failed processor calls skipped under the fail-open policy.",
            [*PROCESSOR_LABELS, "hook"],
            registry=r,
        )
        self.tripwires = Counter(
            "procmesh_tripwires_total",
            "Processor aborts by processor and hook.",
            [*PROCESSOR_LABELS, "hook"],
            registry=r,
        )
        self.violations = Counter(
            "procmesh_violations_total", "onViolation events by processor.", PROCESSOR_LABELS, registry=r
        )
        self.stream_parts = Counter(
            "procmesh_stream_parts_total",
            "Output-stream parts at each processor, by outcome: in (given to it), out (handed on: "
            "its answers' parts, extra parts included), rewritten (answered with another part), "
            "dropped (answered with none).",
            [*PROCESSOR_LABELS, "outcome"],
            registry=r,
        )
        self.stream_part_latency = Histogram(
            "procmesh_stream_part_added_seconds",
            "Latency an output-stream processor adds to a part: from the part's send to its answer "
            "(network included; parts sent in one batch each count from the batch's send).",
            PROCESSOR_LABELS,
            buckets=_PART_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "procmesh_retries_total",
            "Processor-requested retries by kind (step, api_error).",
            ["kind"],
            registry=r,
        )
        self.retry_budget_exhausted = Counter(
            "procmesh_retry_budget_exhausted_total",
            "Retries refused because the budget was used up.",
            ["kind"],
            registry=r,
        )
        self.runs = Counter(
            "procmesh_runs_total",
            "Finished runs by agent and finish reason.",
            ["agent", "finish_reason"],
            registry=r,
        )
        self.run_duration = Histogram(
            "procmesh_run_duration_seconds", "Run latency by agent.", ["agent"], buckets=_BUCKETS, registry=r
        )
        self.model_calls = Counter(
            "procmesh_model_calls_total",
            "Model provider calls by model and outcome.",
            ["model", "outcome"],
            registry=r,
        )
        self.model_call_duration = Histogram(
            "procmesh_model_call_duration_seconds",
            "Successful model calls, first request to last chunk (processing of the stream included).",
            ["model"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.model_tokens = Counter(
            "procmesh_model_tokens_total",
            "Tokens reported by the provider.",
            ["model", "direction"],
            registry=r,
        )
        self.embedding_calls = Counter(
            "procmesh_embedding_calls_total",
            "Embedding calls of semantic recall by embedder, purpose (query: a recall or a search; turn: "
            "a saved turn's messages) and outcome (ok, error).",
            ["model", "purpose", "outcome"],
            registry=r,
        )
        self.embedding_tokens = Counter(
            "procmesh_embedding_tokens_total",
            "Tokens embedded, as the provider counts them.",
            ["model"],
            registry=r,
        )
        self.embedding_duration = Histogram(
            "procmesh_embedding_call_duration_seconds",
            "Successful embedding calls.",
            ["model"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.judge_cache_lookups = Counter(
            "procmesh_judge_cache_lookups_total",
            "Judge verdict cache lookups of the model gateway by calling processor and result: memory "
            "or redis (a stored verdict), joined (the same question in flight), miss (a model call).",
            ["processor", "result"],
            registry=r,
        )
        self.judge_calls_saved = Counter(
            "procmesh_judge_calls_saved_total",
            "Judge model calls not made, by processor and what saved them: cache (a stored or in-flight "
            "verdict), cheap-first (a judge never asked: a deterministic check before it ended the run), "
            "merged (a section answered in another guard's judge call), repeat (a section asked again in "
            "its run, answered with its verdict of moments ago), cancelled (a question in flight when its "
            "run ended, a trip or a cancel: the judge call stopped, nothing cached), precheck (a question "
            "the guard's own pre-check settled, reported by its sidecar through ModelService.ReportSaved).",
            ["processor", "by"],
            registry=r,
        )
        self.judge_calls = Counter(
            "procmesh_judge_calls_total",
            "Judge model calls the gateway made for guards' sections, by model: one per merged call of "
            "several guards, one per guard judged alone (a retry not counted).",
            ["model"],
            registry=r,
        )
        self.judge_verdict_seconds = Histogram(
            "procmesh_judge_verdict_seconds",
            "A guard's wait for its section's verdict at the gateway, by calling processor and source: "
            "alone (its own call), merged (one call with other guards' sections).",
            ["processor", "source"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.gateway_calls = Counter(
            "procmesh_gateway_calls_total",
            "Model gateway calls (ModelService.Generate, and each call of a GenerateBatch) by model, "
            "calling processor and outcome (ok, "
            "invalid_output, not_found, not_in_config, invalid_argument, unauthenticated, "
            "permission_denied, api_error, deadline, cancelled, cost_limit, lease_lost); a model or "
            "processor the config does not name is 'other', none 'unknown'.",
            ["model", "processor", "outcome"],
            registry=r,
        )
        self.gateway_batch_size = Histogram(
            "procmesh_gateway_batch_size",
            "Calls per ModelService.GenerateBatch (a sidecar's calls made at once, sent together; each "
            "is counted in procmesh_gateway_calls_total as a Generate call is).",
            buckets=(2, 4, 8, 16, 32, 64, 128, 256, 1024),
            registry=r,
        )
        self.model_fallbacks = Counter(
            "procmesh_model_fallbacks_total",
            "Model calls handed to the agent's next model (the error processors did not recover the "
            "call), by agent, the model that failed and the one that takes over.",
            ["agent", "failed", "next"],
            registry=r,
        )
        self.cost_admissions = Counter(
            "procmesh_cost_admissions_total",
            "Cost control checks before a model call, by agent and outcome (admitted, refused, warned, "
            "unlimited: no scope, unpriced: no price, store_error: let through uncounted).",
            ["agent", "outcome"],
            registry=r,
        )
        self.cost_spent = Counter(
            "procmesh_cost_spent_total",
            "What settled model calls cost under cost control, in the currency of `prices`.",
            ["agent", "model"],
            registry=r,
        )
        self.cost_unpriced_tokens = Counter(
            "procmesh_cost_unpriced_tokens_total",
            "Tokens of model calls under cost control whose model has no price, by kind (input, output).",
            ["agent", "model", "kind"],
            registry=r,
        )
        self.runs_taken_over = Counter(
            "procmesh_durable_runs_taken_over_total",
            "Durable runs this replica took over after their lease expired.",
            registry=r,
        )
        self.fenced_writes = Counter(
            "procmesh_durable_fenced_writes_total",
            "Writes of a durable run refused because its epoch (fencing token) moved on: another "
            "replica took the run over while this one held an older lease (it stops the run at the "
            "first). By write: checkpoint, renewal, finish, release, event, memory, suspension, cost.",
            ["write"],
            registry=r,
        )
        self.runs_left = Counter(
            "procmesh_durable_runs_left_total",
            "Durable runs whose lease expired that this replica left for another (each run once): "
            "reason 'agent' (its config has not the run's agent) or 'resume' (it could not resume "
            "the run's snapshot, e.g. a processor the run names is missing here).",
            ["reason"],
            registry=r,
        )
        self.takeovers_other_config = Counter(
            "procmesh_durable_takeovers_other_config_total",
            "Durable runs this replica took over that were started under another version of their "
            "agent's config (a rolling deploy).",
            registry=r,
        )
        self.lease_renewals_failed = Counter(
            "procmesh_durable_lease_renewals_failed_total",
            "Lease renewals of durable runs that failed (the store was unreachable).",
            registry=r,
        )
        self.event_log_lag = Gauge(
            "procmesh_event_log_lag_chunks",
            "Chunks of durable runs waiting to be appended to the event log.",
            registry=r,
        )
        self.tool_calls = Counter(
            "procmesh_tool_calls_total",
            "Tool calls the run executed, by tool and outcome (ok, error).",
            ["tool", "outcome"],
            registry=r,
        )
        self.merged_metrics_read_failures = Counter(
            "procmesh_merged_metrics_read_failures_total",
            "Reads of a sidecar's metrics the orchestrator merges into its own (the built-in sidecar "
            "it starts, sidecar_metrics.py) that failed; the last good read is served meanwhile.",
            ["sidecar"],
            registry=r,
        )
        self.store_writes_failed = Counter(
            "procmesh_store_writes_failed_total",
            "Store writes a run's result does not wait on that failed (each logged): its decision "
            "record (what=decision-record), a background tool's result (what=background-result).",
            ["agent", "what"],
            registry=r,
        )
        self.violation_routes_failed = Counter(
            "procmesh_violation_routes_failed_total",
            "Violations an onViolation route failed to deliver (a webhook that failed or timed out, "
            "a Python route that raised; each logged): the run's result has them all the same.",
            ["agent", "processor"],
            registry=r,
        )
        self.chunks = Counter(
            "procmesh_stream_chunks_total",
            "Stream chunks emitted to callers by type family.",
            ["kind"],
            registry=r,
        )
        self._chunk_counters: dict[str, Any] = {}
        self.config_reloads = Counter(
            "procmesh_config_reloads_total",
            "Config reloads (SIGHUP or a change of the config file) by outcome: applied (the new "
            "config serves new runs), unchanged (same content: nothing swapped), refused (it failed "
            "validation or changes a restart-only key; the last good one keeps serving; the log "
            "says why).",
            ["outcome"],
            registry=r,
        )
        self.config_info = Gauge(
            "procmesh_config_info",
            "1 for the version of the config that serves new runs (the first 12 hex digits of the "
            "SHA-256 of its content; /readyz shows it too).",
            ["version"],
            registry=r,
        )

    def config_serving(self, version: str, previous: str | None = None) -> None:
        """The config of `version` serves new runs (`previous` no longer does)."""
        if previous is not None and previous != version:
            with contextlib.suppress(KeyError):  # another App on these metrics removed it
                self.config_info.remove(previous)
        self.config_info.labels(version).set(1)

    def chunk_emitted(self, kind: str, n: int = 1) -> None:
        """Count `n` chunks of type `kind` sent to a caller (the labelled child is kept; an
        output stream's are counted per batch, `RunCore.take_output`)."""
        counter = self._chunk_counters.get(kind)
        if counter is None:
            family = "data" if kind.startswith("data-") else kind
            counter = self._chunk_counters[kind] = self.chunks.labels(family)
        counter.inc(n)

    def total(self, name: str, **labels: str) -> float:
        """The sum of sample `name`'s values whose labels include `labels` (over every agent,
        sidecar and entry the query leaves out); 0 when none has been recorded."""
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def processor_call(self, labels: Series, hook: str, outcome: str) -> None:
        """Count one processor call (`series` gives the labels)."""
        key = (*labels, hook, outcome)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = self.processor_calls.labels(*key)
        calls.inc()
        if outcome == "failed_open":
            self.processor_failures_let_through.labels(*labels, hook).inc()

    def processor_call_took(self, labels: Series, hook: str, seconds: float) -> None:
        """Time one processor call (`series` gives the labels)."""
        key = (*labels, hook)
        took = self._took.get(key)
        if took is None:
            took = self._took[key] = self.processor_call_duration.labels(*key)
        took.observe(seconds)

    def tripwire(self, agent: str, abort: Any) -> None:
        """Count an abort the run applies (a `TripwireAbort`: its entry, hook and source)."""
        self.tripwires.labels(*series(agent, abort.processor_id, abort.source), abort.hook).inc()

    def violation(self, agent: str, entry: str, source: Source | None) -> None:
        """Count a violation reported by `entry` (running at `source`; None: the orchestrator)."""
        self.violations.labels(*series(agent, entry, source)).inc()
