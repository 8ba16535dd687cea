"""The orchestrator's Prometheus collectors (no user content in any label)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class OrchestratorMetrics:
    """Counters and histograms of runs, processor calls, tripwires, retries and chunks."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.processor_calls = Counter(
            "procmesh_processor_calls_total",
            "Processor hook calls by outcome (ok, abort, failed, failed_open).",
            ["processor", "hook", "outcome"],
            registry=r,
        )
        self.processor_call_duration = Histogram(
            "procmesh_processor_call_duration_seconds",
            "Unary processor hook calls as the orchestrator sees them (network included).",
            ["processor", "hook"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.speculative_calls = Counter(
            "procmesh_speculative_calls_total",
            "Hook calls sent before their input was final, by outcome: committed (the input held) "
            "or discarded (an earlier processor changed it, or aborted).",
            ["processor", "hook", "outcome"],
            registry=r,
        )
        self.shadow_verdicts = Counter(
            "procmesh_shadow_verdicts_total",
            "Verdicts of processors in shadow mode (recorded, not enforced), by verdict (allow, abort).",
            ["processor", "hook", "verdict"],
            registry=r,
        )
        self.processor_failures_let_through = Counter(
            "procmesh_processor_failures_let_through_total",
            "Failed processor calls skipped under the fail-open policy.",
            ["processor", "hook"],
            registry=r,
        )
        self.tripwires = Counter(
            "procmesh_tripwires_total",
            "Processor aborts by processor and hook.",
            ["processor", "hook"],
            registry=r,
        )
        self.violations = Counter(
            "procmesh_violations_total", "onViolation events by processor.", ["processor"], registry=r
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
        self.gateway_calls = Counter(
            "procmesh_gateway_calls_total",
            "Model gateway calls (ModelService.Generate) by model, calling processor and outcome (ok, "
            "invalid_output, not_found, not_in_config, invalid_argument, unauthenticated, "
            "permission_denied, api_error, deadline, cancelled, cost_limit, lease_lost); a model or "
            "processor the config does not name is 'other', none 'unknown'.",
            ["model", "processor", "outcome"],
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
            "unlimited: no scope or no price, store_error: let through uncounted).",
            ["agent", "outcome"],
            registry=r,
        )
        self.cost_spent = Counter(
            "procmesh_cost_spent_total",
            "What settled model calls cost under cost control, in the currency of `prices`.",
            ["agent", "model"],
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
        self.chunks = Counter(
            "procmesh_stream_chunks_total",
            "Stream chunks emitted to callers by type family.",
            ["kind"],
            registry=r,
        )
        self._chunk_counters: dict[str, Any] = {}

    def chunk_emitted(self, kind: str) -> None:
        """Count a chunk sent to a caller (once per chunk: the labelled child is kept)."""
        counter = self._chunk_counters.get(kind)
        if counter is None:
            family = "data" if kind.startswith("data-") else kind
            counter = self._chunk_counters[kind] = self.chunks.labels(family)
        counter.inc()

    def processor_call(self, processor: str, hook: str, outcome: str) -> None:
        """Count one processor call."""
        self.processor_calls.labels(processor, hook, outcome).inc()
        if outcome.startswith("shadow_"):
            self.shadow_verdicts.labels(processor, hook, outcome.removeprefix("shadow_")).inc()
        if outcome == "failed_open":
            self.processor_failures_let_through.labels(processor, hook).inc()
