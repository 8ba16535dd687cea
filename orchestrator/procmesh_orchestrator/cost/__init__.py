"""Cost control: an agent's spending limit per scope and window (the reference's TokenCostControl).

A limit (`costControl` in an agent's config) is checked before each model call and updated after
it, in the store every replica shares (`MemoryStore.reserve_cost`): the call reserves its
estimated cost atomically against the scope's limit, so replicas admitting calls of one resource
at the same moment never both see room for the last one; when the call ends, its actual cost
(the provider's usage, priced from the config's ``prices``) replaces the estimate, and a call
that did not happen (an API error, a cached response) releases it. Judge calls a processor makes
through the model gateway for a run count against the same limit. A durable run's reservations
carry its fence (`RunFence`): once another replica took the run over, the store refuses them and
the stale replica stops the run before its model call.
"""

from procmesh_orchestrator.cost.control import (
    PROCESSOR_ID,
    CostControl,
    CostLimitError,
    Reservation,
    RunCost,
    cost_nanos,
)

__all__ = ["PROCESSOR_ID", "CostControl", "CostLimitError", "Reservation", "RunCost", "cost_nanos"]
