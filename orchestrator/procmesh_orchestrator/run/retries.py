"""The retry budget: step retries a processor asks for (with feedback), and API-error retries."""

from __future__ import annotations

import asyncio
import logging
import time

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import APIErrorArgs, APIErrorResult, Effects, Processor, dedupe
from procmesh_orchestrator.run.speculation import walk

log = logging.getLogger(__name__)

DEFAULT_ERROR_RETRY_CAP = 3


def may_retry_step(run: RunCore) -> bool:
    """Whether an abort with ``retry`` may run the step again (maxProcessorRetries allows it)."""
    if run.max_retries is None:
        log.warning(
            "agent %s: a processor asked for a retry but maxProcessorRetries is not set; "
            "treating it as an abort",
            run.agent.id,
        )
        return False
    if run.info.retry_count >= run.max_retries:
        run.metrics.retry_budget_exhausted.labels("step").inc()
        return False
    return True


def retry_with_feedback(run: RunCore, reason: str) -> None:
    """Append the reason after the conversation as a persisted <system-reminder> signal."""
    run.ml.add_signal({"type": "reactive", "contents": reason})
    run.info.retry_count += 1
    run.metrics.retries.labels("step").inc()


def error_retry_cap(run: RunCore) -> int | None:
    """maxProcessorRetries when set; else 3 whenever the resolved error list is non-empty."""
    if run.max_retries is not None:
        return run.max_retries
    if not run.error_lane:
        return None
    if not run.agent.warned_implicit_cap:
        run.agent.warned_implicit_cap = True
        log.warning(
            "agent %s: maxProcessorRetries is not set; error processors may retry at most %d "
            "times per step (set maxProcessorRetries to choose)",
            run.agent.id,
            DEFAULT_ERROR_RETRY_CAP,
        )
    return DEFAULT_ERROR_RETRY_CAP


async def api_error(run: RunCore, err: APICallError) -> bool:
    """Run processAPIError (every lane, once each, until one asks for a retry); True to retry.

    The failed call's attempt is over whatever they decide: its guards' judge questions still in
    flight are given up first (`AgentSpec.attempt_failed`), not left to run to their end."""
    if run.agent.attempt_failed is not None:
        run.agent.attempt_failed(run.run_id)
    retry = False

    def build(item: Processor) -> APIErrorArgs:
        return APIErrorArgs(
            status=err.status,
            message=err.message,
            body=err.body,
            retryable=err.retryable,
            error_id=err.error_id,
            details=err.details,
            messages=run.ml.view(),
            steps=run.steps,
        )

    async def apply(item: Processor, args: APIErrorArgs, result: APIErrorResult, effects: Effects) -> bool:
        nonlocal retry
        if effects.abort is None and result.messages is not None:
            run.system.extend(run.ml.apply(args.messages, result.messages, msgs.INPUT))
        await run.apply(effects)
        if not result.retry:
            return False
        cap = error_retry_cap(run)
        if cap is None or run.info.retry_count >= cap:
            run.metrics.retry_budget_exhausted.labels("api_error").inc()
            return True
        if await _wait_before_retry(run, result.retry_delay_ms):
            run.info.retry_count += 1
            run.metrics.retries.labels("api_error").inc()
            retry = True
        return True

    lanes = dedupe([*run.input_lane, *run.output_lane, *run.error_lane])
    await walk(run, lanes, "process_api_error", build, apply)
    return retry


async def _wait_before_retry(run: RunCore, delay_ms: float) -> bool:
    """Wait the delay an error processor asked for; False when the run's deadline comes first.

    The wait is the orchestrator's, not the hook's: a 7 s Retry-After no longer outlives a 5 s
    hook timeout, and a run never sleeps past its own deadline only to fail then.
    """
    if delay_ms <= 0:
        return True
    delay = delay_ms / 1000
    deadline = run.info.deadline
    if deadline is not None and time.monotonic() + delay >= deadline:
        log.warning(
            "run %s: a retry in %.1fs would pass the run's deadline; not retrying", run.info.run_id, delay
        )
        return False
    await asyncio.sleep(delay)
    return True
