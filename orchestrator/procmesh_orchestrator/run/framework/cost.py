"""Cost control: an agent's spending limit per scope and window (the reference's TokenCostControl).

`CostControl` is an agent's limit; `RunCost` its framework processor in one run. A limit
(`costControl` in an agent's config, read here through `CostLimit` and `Price`) is checked before
each model call and updated after it, in the store every replica shares
(`MemoryStore.reserve_cost`): the call reserves its estimated cost atomically against the scope's
limit, so replicas admitting calls of one resource at the same moment never both see room for the
last one; when the call ends, its actual cost (the provider's usage, priced from the config's
``prices``) replaces the estimate, and a call that did not happen (an API error, a cached
response) releases it. Judge calls a processor makes through the model gateway for a run count
against the same limit. A durable run's reservations carry its fence (`RunFence`): once another
replica took the run over, the store refuses them and the stale replica stops the run before its
model call.

A tenant's limit: ``maxCost`` and ``scope`` may each be ``{fromContext: KEY, default: VALUE}``
(the form of processor options, `processors.options`): each run takes the request context's
``KEY``, else the default, as it starts; a value that is no limit (not a number above 0, not a
scope) fails the run before any hook with a `RequestContextError` naming the key. With
``cases: {VALUE: LIMIT}`` the context's value picks a limit instead (``fromContext: resourceId``:
the resource the caller's API key is bound to, which no caller can set).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from procmesh_orchestrator.errors import (
    FencedWriteError,
    MemoryStoreError,
    OrchestratorError,
    RequestContextError,
    TripwireAbort,
)
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run.framework import FrameworkProcessor
from procmesh_orchestrator.run.hooks import APIErrorArgs, HookArgs, LLMRequestArgs, LLMResponseArgs
from procmesh_orchestrator.run.types import choosing_context
from procmesh_orchestrator.store import MemoryStore, RunFence

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)

R = TypeVar("R")

PROCESSOR_ID = "token-cost-control"
"""The id its tripwires and violations carry (the reference's)."""
NANOS = 1_000_000_000
"""Costs are kept as integers, in billionths of the prices' currency: sums stay exact."""
_CHARS_PER_TOKEN = 4
"""How a prompt's size becomes an input-token estimate before the provider counts it."""
SCOPES = ("run", "resource", "thread", "user", "organization", "session", "agent", "global")
"""Whose spending a limit counts (`config.cost.CostScope`)."""
CONTEXT_SCOPES = {"user": "userId", "organization": "organizationId", "session": "sessionId"}
"""Scopes whose id is a plain request-context key, as the reference reads them."""


class Price(Protocol):
    """What a model costs, per million tokens (the config's `PriceConfig` is one)."""

    @property
    def input(self) -> float: ...

    @property
    def output(self) -> float: ...


class FromContext(Protocol):
    """A setting each run takes from its request context (the config's ``{fromContext, default}``)."""

    @property
    def from_context(self) -> str:
        """The request-context key."""
        ...

    @property
    def default(self) -> Any:
        """The value of a run whose context lacks the key."""
        ...

    @property
    def cases(self) -> Mapping[str, Any] | None:
        """Values by the context's value (None: the context's value itself)."""
        ...


class CostLimit(Protocol):
    """An agent's limit as the run reads it (the config's `CostControlConfig` is one)."""

    @property
    def max_cost(self) -> float | FromContext: ...

    @property
    def scope(self) -> str | FromContext:
        """One of `SCOPES`."""
        ...

    @property
    def strategy(self) -> str:
        """``block`` or ``warn``."""
        ...

    @property
    def message(self) -> str: ...

    @property
    def warn_at_percent(self) -> float | None: ...

    @property
    def reserve_output_tokens(self) -> int: ...

    @property
    def window_seconds(self) -> int: ...


class CostLimitError(OrchestratorError):
    """A model call refused because its scope spent its limit (a gateway judge call: RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, metadata: dict[str, Any]) -> None:
        super().__init__(message)
        self.metadata = metadata


def cost_nanos(price: Price, input_tokens: int, output_tokens: int) -> int:
    """What the tokens cost at `price` (per million tokens), in nano-units."""
    # price per million tokens * 1e9 nanos / 1e6 tokens = price * 1000 nanos per token
    return round((input_tokens * price.input + output_tokens * price.output) * 1000)


def _units(nanos: int) -> float:
    return nanos / NANOS


def _number(value: float) -> str:
    """A cost as the reference prints it: no float noise (0.30000000000000004 is 0.3)."""
    return str(float(f"{value:.6f}")).removesuffix(".0")


@dataclass(frozen=True)
class RunLimit:
    """The limit one run (or gateway call) counts against: `CostControl.limit_for`."""

    max_cost: float
    scope: str

    @property
    def nanos(self) -> int:
        """The limit in nano-units, as the ledger counts."""
        return round(self.max_cost * NANOS)


def _taken(setting: FromContext | Any, request_context: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The setting's value for a run, and the request-context key it came from (None: fixed)."""
    if isinstance(setting, str | int | float):
        return setting, None
    key, cases = setting.from_context, setting.cases
    if cases is not None:  # checked at load: a case is a limit whatever the caller sent
        found = request_context.get(key)
        return (cases[found] if isinstance(found, str) and found in cases else setting.default), None
    return (request_context[key], key) if key in request_context else (setting.default, None)


def _bad_limit(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf


@dataclass(frozen=True)
class Reservation:
    """A model call's hold on its scope's limit, until it settles or is released."""

    id: str
    model_id: str
    priced: bool = True
    """False: an unpriced model's call, held nowhere; settling counts its tokens only."""


class CostControl:
    """An agent's limit, with the prices and the store: `for_call` gives each run its `RunCost`."""

    def __init__(
        self,
        agent_id: str,
        config: CostLimit,
        prices: Mapping[str, Price],
        store: Callable[[], Awaitable[MemoryStore]],
        metrics: OrchestratorMetrics,
    ) -> None:
        self.agent_id = agent_id
        self.config = config
        self.prices = dict(prices)
        self.store = store
        self.metrics = metrics
        self.default = self.limit_for({})
        """The limit of a run whose request context has none of the keys (a gateway call's
        outside any run of this replica)."""
        self.limit = self.default.nanos
        self._runs: weakref.WeakValueDictionary[str, RunCost] = weakref.WeakValueDictionary()
        self._unpriced: set[str] = set()

    def limit_for(self, request_context: Mapping[str, Any]) -> RunLimit:
        """The limit of a run with this request context: RequestContextError naming the key when
        the context's value is not a number above 0 (``maxCost``) or not a scope (``scope``)."""
        max_cost, cost_key = _taken(self.config.max_cost, request_context)
        scope, scope_key = _taken(self.config.scope, request_context)
        for setting, value, key, bad, wanted in (
            ("maxCost", max_cost, cost_key, _bad_limit(max_cost), "a number greater than 0"),
            ("scope", scope, scope_key, scope not in SCOPES, f"one of {', '.join(SCOPES)}"),
        ):
            if bad:
                raise RequestContextError(
                    f"agent {self.agent_id!r}: costControl.{setting} (request-context key {key!r}): "
                    f"{value!r} is not {wanted}",
                    keys=[key] if key is not None else [],
                )
        return RunLimit(float(max_cost), str(scope))

    def for_call(self, run: RunCore) -> RunCost:
        """The run's processor, with the limit its caller's request context gives it (the
        RequestContextError of `limit_for` before any hook); the gateway finds it by run id
        while the run lives."""
        limit = self.limit_for(choosing_context(run.options))
        key = self.scope_key(
            limit.scope, run.info.resource_id, run.info.thread_id, run.run_id, run.options.request_context
        )
        cost = RunCost(self, run, limit, key)
        self._runs[run.run_id] = cost
        return cost

    def of_run(self, run_id: str) -> RunCost | None:
        """The live run's processor (a judge call of that run counts against its limit)."""
        return self._runs.get(run_id)

    def for_gateway(self, resource_id: str | None) -> RunCost:
        """The limit as a model gateway call outside any run of this replica meets it: its scope
        key from what the call has (the resource its key is bound to; never a thread, a run, or
        a request context's id)."""
        return RunCost(self, None, self.default, self.scope_key(self.default.scope, resource_id))

    def scope_key(
        self,
        scope: str,
        resource_id: str | None,
        thread_id: str | None = None,
        run_id: str | None = None,
        request_context: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The ledger key a call counts under in `scope` (None: not limited, as the reference
        skips a scope whose id the call lacks)."""
        if scope == "global":
            return "global"
        if scope == "agent":
            return f"agent:{self.agent_id}"
        if scope == "run":
            return f"run:{run_id}" if run_id else None
        if scope in CONTEXT_SCOPES:
            found = (request_context or {}).get(CONTEXT_SCOPES[scope])
            return f"{scope}:{found}" if isinstance(found, str) and found else None
        if scope == "resource":
            return f"resource:{resource_id}" if resource_id else None
        # thread ids are scoped by resource (two tenants may each have a "t1"): the key holds both,
        # the resource's length first so no pair of ids can spell another pair's key
        resource = resource_id or ""
        return f"thread:{len(resource)}:{resource}/{thread_id}" if thread_id else None

    def price(self, model_id: str) -> Price | None:
        """The model's price; an unpriced model (a judge or a processor's override) is logged once."""
        price = self.prices.get(model_id)
        if price is None and model_id not in self._unpriced:
            self._unpriced.add(model_id)
            log.warning(
                "agent %s: token-cost-control: model %r has no price in `prices`: its calls count "
                "by tokens only (procmesh_cost_unpriced_tokens_total), not against maxCost; "
                "add prices.%s to count them",
                self.agent_id,
                model_id,
                model_id,
            )
        return price


class RunCost(FrameworkProcessor):
    """One run's cost check: reserves before each model call (processLLMRequest, after your
    processors changed the prompt), settles after it (processLLMResponse), releases what a
    rejected or cached call held (processAPIError, processLLMResponse). A call that never settled
    (cut off mid-stream, or stopped by a later processor) keeps its estimate: it may have cost."""

    processor_id = PROCESSOR_ID
    hooks = frozenset({"process_llm_request", "process_llm_response", "process_api_error"})
    key = f"cost:{PROCESSOR_ID}"

    def __init__(
        self, control: CostControl, run: RunCore | None, limit: RunLimit, scope_key: str | None
    ) -> None:
        self.control = control
        self.run = run
        self.limit = limit
        self.scope_key = scope_key
        self.open: Reservation | None = None
        """The step's reservation, until its call settles or fails."""
        self._warned: set[str] = set()

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        if isinstance(args, LLMRequestArgs):
            await self._release_open()  # a retried step's rejected call (processAPIError did not reach us)
            settings = run.options.model_settings or {}
            try:
                self.open = await self.reserve(args.model, args.prompt, settings.get("maxOutputTokens"))
            except CostLimitError as exc:
                raise run.aborted(
                    TripwireAbort(PROCESSOR_ID, str(exc), False, exc.metadata, args.hook)
                ) from None
        elif isinstance(args, LLMResponseArgs):
            opened, self.open = self.open, None
            if opened is not None:
                if args.from_cache:
                    await self.release(opened)
                else:
                    await self.settle(opened, _usage(args.chunks))
        elif isinstance(args, APIErrorArgs):
            await self._release_open()
        return None

    async def _release_open(self) -> None:
        opened, self.open = self.open, None
        if opened is not None:
            await self.release(opened)

    async def reserve(self, model_id: str, prompt: Any, max_output_tokens: Any = None) -> Reservation | None:
        """Hold the call's estimated cost against the limit; `CostLimitError` when the scope spent
        it (``block``), a violation when it did (``warn``). None: the call is not counted (no scope
        key for this run, an unpriced model, or the store failed: the reference fails open)."""
        control, cfg = self.control, self.control.config
        price = control.price(model_id)
        if price is None:  # counted by its tokens when it settles
            control.metrics.cost_admissions.labels(control.agent_id, "unpriced").inc()
            return Reservation(str(uuid.uuid4()), model_id, priced=False)
        if self.scope_key is None:
            control.metrics.cost_admissions.labels(control.agent_id, "unlimited").inc()
            return None
        output = max_output_tokens if isinstance(max_output_tokens, int) else cfg.reserve_output_tokens
        estimate = cost_nanos(
            price, math.ceil(len(json.dumps(prompt, default=str)) / _CHARS_PER_TOKEN), output
        )
        reservation = Reservation(str(uuid.uuid4()), model_id)
        try:
            store = await control.store()
            admission = await store.reserve_cost(
                self.scope_key,
                reservation.id,
                estimate,
                limit=self.limit.nanos,
                window_seconds=cfg.window_seconds,
                enforce=cfg.strategy == "block",
                fence=self._fence(),
            )
        except FencedWriteError as exc:  # a durable run another replica holds now: no call here
            self._fenced(exc)
            raise
        except MemoryStoreError as exc:
            control.metrics.cost_admissions.labels(control.agent_id, "store_error").inc()
            log.warning(
                "agent %s: costControl: the store failed; the call goes on uncounted: %s",
                control.agent_id,
                exc,
            )
            return None
        spent = admission.spent
        if spent >= self.limit.nanos:
            message = cfg.message.replace("{usage}", _number(_units(spent))).replace(
                "{limit}", _number(self.limit.max_cost)
            )
            if cfg.strategy == "block":
                control.metrics.cost_admissions.labels(control.agent_id, "refused").inc()
                raise CostLimitError(message, self._metadata(spent))
            control.metrics.cost_admissions.labels(control.agent_id, "warned").inc()
            self._warn("hard", message, spent)
            return reservation
        control.metrics.cost_admissions.labels(control.agent_id, "admitted").inc()
        if cfg.warn_at_percent is not None and spent >= self.limit.nanos * cfg.warn_at_percent / 100:
            message = (
                f"Cost control: estimated cost reached {_number(cfg.warn_at_percent)}% of the limit "
                f"({_number(_units(spent))}/{_number(self.limit.max_cost)})"
            )
            self._warn("soft", message, spent)
        return reservation

    async def settle(self, reservation: Reservation, usage: Mapping[str, Any]) -> None:
        """Replace the estimate with the call's actual cost (a store failure keeps the estimate); an
        unpriced call's tokens are counted instead."""
        tokens = int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)
        if not reservation.priced:
            unpriced = self.control.metrics.cost_unpriced_tokens
            for kind, count in zip(("input", "output"), tokens, strict=True):
                unpriced.labels(self.control.agent_id, reservation.model_id, kind).inc(count)
            return
        price = self.control.price(reservation.model_id)
        assert price is not None  # only priced calls reserve
        actual = cost_nanos(price, *tokens)
        self.control.metrics.cost_spent.labels(self.control.agent_id, reservation.model_id).inc(
            _units(actual)
        )
        try:
            await (await self.control.store()).settle_cost(reservation.id, actual, fence=self._fence())
        except FencedWriteError as exc:
            self._fenced(exc)
            raise
        except MemoryStoreError as exc:
            log.warning("costControl: settling %s failed (its estimate stays): %s", reservation.id, exc)

    async def release(self, reservation: Reservation) -> None:
        """Give the estimate back: the call did not cost anything (a store failure keeps it)."""
        if not reservation.priced:
            return
        try:
            await (await self.control.store()).release_cost(reservation.id, fence=self._fence())
        except FencedWriteError as exc:
            self._fenced(exc)
            raise
        except MemoryStoreError as exc:
            log.warning("costControl: releasing %s failed (its estimate stays): %s", reservation.id, exc)

    def _fence(self) -> RunFence | None:
        """The durable run's fence: its ledger writes are refused once another replica holds it."""
        return None if self.run is None else self.run.fence

    def _fenced(self, exc: FencedWriteError) -> None:
        if self.run is not None:
            self.run.fenced("cost", exc)

    def _metadata(self, spent: int) -> dict[str, Any]:
        """The tripwire's metadata, as the reference's."""
        return {
            "processorId": PROCESSOR_ID,
            "usage": {"estimatedCost": _units(spent), "costUnit": None},
            "maxCost": self.limit.max_cost,
            "scope": self.limit.scope,
            "scopeKey": self.scope_key,
            "threshold": "hard",
        }

    def _warn(self, threshold: str, message: str, spent: int) -> None:
        """A violation, at most once per run and threshold (the reference's per-request dedup)."""
        if threshold in self._warned:
            return
        self._warned.add(threshold)
        detail = {
            "usage": _units(spent),
            "limit": self.limit.max_cost,
            "totalUsage": {"estimatedCost": _units(spent), "costUnit": None},
            "scope": self.limit.scope,
            "scopeKey": self.scope_key,
            "threshold": threshold,
        }
        log.warning("agent %s: %s", self.control.agent_id, message)
        if self.run is not None:  # a gateway call outside a run has no result to record it in
            self.run.violation(PROCESSOR_ID, message, detail)


class CostSlot(FrameworkProcessor):
    """A ``token-cost-control`` lane entry: the place in the input lane where each run's `RunCost`
    runs (the agent has one limit, `CostControl`; each run its own `RunCost`)."""

    processor_id = PROCESSOR_ID
    hooks = RunCost.hooks
    key = RunCost.key

    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        return None if run.cost is None else await run.cost.run_hook(run, args)


def _usage(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    for chunk in reversed(chunks):
        if chunk.get("type") == "finish":
            return cast(dict[str, Any], (chunk.get("payload") or {}).get("usage") or {})
    return {}
