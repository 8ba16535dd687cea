"""The judge planner: every guard's question about one text, in one judge call per judge model.

**The entry point** is `JudgePlanner.judge` (type `Judge`): one guard's `SectionRequest` in, its
`SectionVerdict` out (or `Refused`). The model gateway calls it for every request that carries a
``section`` (proto ``JudgeSection``); a verdict cache or a cheap-first check wraps it, keeping the
signature, at the one line where the gateway's judging (`gateway_judging`) sets ``self.judge``.

**Merging.** Requests with the same `SectionRequest.merge_key` (model, run, phase, content,
settings, the caller's tenant) that arrive together become ONE model call (`judge_sections`: a
section per guard, each with its own instructions and schema), and each caller gets its own section.
How long to wait is planned from the lanes, not guessed (`judge_plan`): `JudgePlan` counts, per
agent, judge model and phase, the entries of one lane that name that model without
``merge_judge: false``, less the built-ins certain not to ask about the text (the run's agent's when
the run is live on this replica, else the most any agent has). A group goes out as soon as that many
requests are in it (a guard the verdict cache or a repeat answered about the text counts as in:
`JudgePlanner.answered`), at once when the plan says one (a lone guard waits for nothing), else once
its lane (the run's phase on that model) has sent nothing for `MERGE_WINDOW` (a question the verdict
cache answers counts: `JudgePlanner.sending`), and at the latest `MERGE_CAP` after its first
request. A guard the plan knows is certain to ask about the text (`JudgePlan.sure`: a built-in guard
whose skip rules it models, the text long enough for it) is waited for past the window, to the cap:
under load a sidecar wakes late. Any other guard is not, nor a sure one whose question failed
earlier in the lane (a guard failed open judges no more of its step), nor any while no sure guard
has asked about the text (their sidecar may be down). A window's timer that fires late (`_fire`: the
loop was away, the requests that came meanwhile are unread) waits one window more. Each group's
going is logged at DEBUG with why (``complete``, ``quiet``, ``cap``) when it went short. A group of
one is the guard's own call, made alone with its own prompt: exactly what it was without the
planner.

**Repeats.** The orchestrator may ask a speculative entry again with the same text (an entry
before it changed only its input's metadata, as language detection does): the very same
question in the same run, answered less than `REPEAT_SECONDS` ago, gets that verdict at once.

**Failures.** A call that fails (the provider, the deadline, cost control) fails every section
in it. A section whose value does not match its guard's schema gets one retry, merged with the
other failed sections and told what was wrong, as a call alone gets one; after that only its
guard's request fails (FAILED_PRECONDITION), and its processor's ``onFailure`` applies.

**Metrics.** ``procmesh_judge_calls_total{model}`` counts the judge calls made for sections,
``procmesh_judge_calls_saved_total{processor,by}`` the calls not made (``by="merged"``: a merged
call of n sections counts one under each processor but the first's; ``repeat``: a verdict given
again; a cache or cheap-first wrapper counts ``cache`` / ``cheap-first``), and
``procmesh_judge_verdict_seconds{processor,source}`` each guard's wait for its verdict (the
gateway's ``source``: ``alone`` or ``merged``).
The merged call is traced as ``procmesh.judge <model>`` (its sections and their processors as
attributes), each guard's wait as ``procmesh.judge.section <processor>`` under its gateway span.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from procmesh import tracing
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.service.grpc.judge_plan import JudgePlan
from procmesh_orchestrator.service.grpc.judge_sections import (
    Refused,
    SectionRequest,
    SectionVerdict,
    lane_key,
    merge_key,
    merged_prompt,
    merged_schema,
    section_names,
    shares,
    split,
)

log = logging.getLogger(__name__)

MERGE_WINDOW = 0.05
"""Seconds a group still missing requests its plan expects waits after its lane's last request."""
MERGE_CAP = 1.0
"""Seconds a group waits at most (from its first request), however long its lane keeps sending."""
_STALL = 0.02
"""Seconds late a group's timer may fire and still show its lane was quiet (later: the loop was
away, and what came meanwhile is unread)."""
REPEAT_SECONDS = 30.0
"""Seconds a section's verdict answers the very same question again in the same run: a
speculative call the orchestrator discarded (an entry before it changed its input's metadata)
and asks again gets the verdict at once, with no second call and no wait for a group."""
_REPEATS = 4096
"""Verdicts kept for repeats (the oldest out first)."""

Judge = Callable[[SectionRequest], Awaitable[SectionVerdict]]
"""One guard's verdict: the planner's entry point, and the shape of anything wrapping it."""

Once = Callable[
    [SectionRequest, list[dict[str, Any]], dict[str, Any]], Awaitable[tuple[str, str, dict[str, int], str]]
]
"""One model call for a merged prompt and schema: (text, finish reason, usage, model id)."""
Alone = Callable[[SectionRequest], Awaitable[SectionVerdict]]
"""A request's own call, with its own prompt and the gateway's retry (nothing merged)."""


@dataclass
class _Text:
    """The guards that asked about one text of a run's lane (by the id their questions carry)."""

    arrived: set[str] = field(default_factory=set)
    """Every guard whose question reached the gateway (whatever answered it)."""
    settled: set[str] = field(default_factory=set)
    """The guards answered without a call (the verdict cache, a repeat): none of theirs to wait for."""
    failed: set[str] = field(default_factory=set)
    """The guards whose question failed earlier in the text's lane (never waited for again)."""


@dataclass
class _Group:
    expected: int
    sure: frozenset[frozenset[str]]
    """The guards known to ask about the text (each by the ids its questions may carry)."""
    lane: str
    started: float
    text: _Text
    members: list[tuple[SectionRequest, asyncio.Future[SectionVerdict]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    due: float = 0.0
    """When `timer` was due (a timer that fires late found the loop away: see `_fire`)."""
    arrived: list[float] = field(default_factory=list)

    def complete(self) -> bool:
        """Every question the plan expects is in: the members, with the guards answered without a
        call counted, make the plan's number."""
        ids = {r.guard_id for r, _ in self.members}
        return len(self.members) + len(self.text.settled - ids) >= self.expected

    def awaiting(self) -> bool:
        """A guard certain to ask about the text has not asked yet: one of them has (their
        sidecar is up), and its question did not fail earlier in the lane."""
        arrived = self.text.arrived
        if not any(ids & arrived for ids in self.sure):
            return False
        return any(not (ids & arrived) and not (ids & self.text.failed) for ids in self.sure)


class JudgePlanner:
    """Coalesces guards' section requests into merged judge calls (see the module's doc)."""

    def __init__(
        self,
        config: Callable[[], Config],
        once: Once,
        alone: Alone,
        metrics: Any,
        model_label: Callable[[str], str],
        window: float = MERGE_WINDOW,
    ) -> None:
        self._config = config
        self._plan_of: tuple[Config | None, JudgePlan] = (None, JudgePlan({}))
        self._once = once
        self._alone = alone
        self._metrics = metrics
        self._label = model_label
        self._window = window
        self._open: dict[str, _Group] = {}
        self._lanes: dict[str, set[str]] = {}
        """A lane's groups still waiting (by merge key): its every request keeps them waiting."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._answered: OrderedDict[str, tuple[float, SectionVerdict]] = OrderedDict()
        self._texts: OrderedDict[str, _Text] = OrderedDict()
        """The guards that asked about each recent text (by merge key), the oldest out first."""
        self._failed: OrderedDict[str, set[str]] = OrderedDict()
        """Per recent lane, the guards whose question failed in it (the oldest lane out first)."""

    def _plan(self) -> JudgePlan:
        """The serving config's plan (made again after a reload)."""
        config = self._config()
        if config is not self._plan_of[0]:
            self._plan_of = (config, JudgePlan.of(config))
        return self._plan_of[1]

    async def judge(self, request: SectionRequest) -> SectionVerdict:
        """`request`'s own verdict, from a call shared with every request merged with it."""
        loop = asyncio.get_running_loop()
        key, lane = request.merge_key(), request.lane_key()
        text = self._text(key, lane)
        text.arrived.add(request.guard_id)
        answered = self._answered.get(_repeat_key(request))
        if answered is not None and loop.time() - answered[0] < REPEAT_SECONDS:
            self._metrics.judge_calls_saved.labels(request.processor, "repeat").inc()
            self._settled(key, lane, request.guard_id)
            return answered[1]
        group = self._open.get(key)
        if group is None:
            plan = self._plan()
            group = _Group(plan.count(request), plan.sure(request), lane, loop.time(), text)
            self._open[key] = group
            self._lanes.setdefault(lane, set()).add(key)
        future: asyncio.Future[SectionVerdict] = loop.create_future()
        group.members.append((request, future))
        group.arrived.append(loop.time())
        if group.complete():  # all the plan expects are in
            self._dispatch(key, group, "complete")
        self._hold(lane)
        try:
            return await future
        except Exception:
            # a guard failed open judges no more of its step: its later questions are not waited for
            self._failed_in(lane).add(request.guard_id)
            raise

    def sending(
        self, request: mpb.ModelServiceGenerateRequest, resource: str | None, settings: Mapping[str, Any]
    ) -> None:
        """A gateway request came in that may never reach `judge` (a verdict cache may answer it):
        when it carries a section, its lane is still sending, and its waiting groups wait on.

        Guards send their questions about a run's texts together, and the gateway takes them one
        after another: with the history's answers in the cache, one guard's question about a new
        text and the next guard's about the same text have the cached ones between them, and a
        group that went out at that pause would leave short, the others in calls of their own.
        Its guard has asked about its text: a group waiting for it as a guard known to ask stops
        waiting for it longer than its lane's window."""
        if request.HasField("section"):
            lane = self._lane_of(request, resource, settings)
            self._text(merge_key(lane, request.section.content), lane).arrived.add(request.processor_id)
            self._hold(lane)

    def answered(
        self, request: mpb.ModelServiceGenerateRequest, resource: str | None, settings: Mapping[str, Any]
    ) -> None:
        """A sectioned request was answered without reaching `judge` (the verdict cache): a group
        about its text counts it as in (it goes out once the rest the plan expects are)."""
        if request.HasField("section"):
            lane = self._lane_of(request, resource, settings)
            self._settled(merge_key(lane, request.section.content), lane, request.processor_id)

    def cached(
        self, request: mpb.ModelServiceGenerateRequest, resource: str | None, settings: Mapping[str, Any]
    ) -> None:
        """`sending` and `answered` at once, for a request the verdict cache answered without awaiting."""
        if request.HasField("section"):
            lane = self._lane_of(request, resource, settings)
            key = merge_key(lane, request.section.content)
            self._text(key, lane).arrived.add(request.processor_id)
            self._hold(lane)
            self._settled(key, lane, request.processor_id)

    @staticmethod
    def _lane_of(
        request: mpb.ModelServiceGenerateRequest, resource: str | None, settings: Mapping[str, Any]
    ) -> str:
        return lane_key(request.model, request.run_id, resource, request.section.phase, settings)

    def _text(self, key: str, lane: str) -> _Text:
        """What the planner knows of the guards that asked about one text (by merge key) of `lane`."""
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = _Text(failed=self._failed_in(lane))
            while len(self._texts) > _REPEATS:
                self._texts.popitem(last=False)
        return text

    def _failed_in(self, lane: str) -> set[str]:
        """The guards whose question failed in `lane` (one set, shared by the lane's texts)."""
        failed = self._failed.get(lane)
        if failed is None:
            failed = self._failed[lane] = set()
            while len(self._failed) > _REPEATS:
                self._failed.popitem(last=False)
        return failed

    def _settled(self, key: str, lane: str, guard_id: str) -> None:
        text = self._text(key, lane)
        text.arrived.add(guard_id)
        text.settled.add(guard_id)
        group = self._open.get(key)
        if group is not None and group.complete():
            self._dispatch(key, group, "complete")

    def _hold(self, lane: str) -> None:
        """The lane is still sending: each of its waiting groups waits `window` more (capped).

        Guards send their questions about a run's texts one after another (a guard judging
        twenty messages sends twenty), so a group's last member may come long after its first
        while the lane's requests keep arriving; once they stop, what is in goes out."""
        now = asyncio.get_running_loop().time()
        for key in self._lanes.get(lane, ()):
            group = self._open[key]
            due = min(now + self._window, group.started + MERGE_CAP)
            if group.timer is None:
                self._arm(key, group, due)
            else:  # later only: the armed timer finds it moved (`_fire`), no timer made per request
                group.due = due

    def _arm(self, key: str, group: _Group, at: float) -> None:
        if group.timer is not None:
            group.timer.cancel()
        group.due = at
        group.timer = asyncio.get_running_loop().call_at(at, self._fire, key, group)

    def _fire(self, key: str, group: _Group) -> None:
        """A group's lane was quiet for its window: it goes out, unless the loop was away or a
        guard known to ask has not asked yet (it waits on, to the cap).

        A timer that fires late found the loop busy or not scheduled (a loaded machine): the
        requests that came in meanwhile are still unread in gRPC's queues, and the lane only
        looked quiet. Measured at load 6-8: the loop away 250 ms, the timers due in it fired
        before the third guard's questions about eleven windows were read, and each went out
        short, the third guard's question in a call of its own."""
        now = asyncio.get_running_loop().time()
        if now < group.due:  # its lane sent more since the timer was set (`_hold`): wait on to it
            group.timer = asyncio.get_running_loop().call_at(group.due, self._fire, key, group)
            return
        cap = group.started + MERGE_CAP
        if now < cap:
            if now - group.due > _STALL:
                self._arm(key, group, min(now + self._window, cap))
                return
            if group.awaiting():
                self._arm(key, group, cap)
                return
        self._dispatch(key, group, "quiet" if now < cap else "cap")

    def _dispatch(self, key: str, group: _Group, why: str) -> None:
        """`group` goes out: every question it expects is in (`why` ``complete``), its lane was
        quiet and no sure guard is missing (``quiet``), or it reached `MERGE_CAP` (``cap``)."""
        if self._open.get(key) is group:
            del self._open[key]
            waiting = self._lanes[group.lane]
            waiting.discard(key)
            if not waiting:
                del self._lanes[group.lane]
        if group.timer is not None:
            group.timer.cancel()
        if len(group.members) < group.expected and log.isEnabledFor(logging.DEBUG):
            log.debug(  # what an operator needs to see why a group went out short
                "judge group short (%s): %d of %d sections (%s) arriving at +%s ms, sent at +%.0f ms",
                why,
                len(group.members),
                group.expected,
                ",".join(r.guard_id for r, _ in group.members),
                ",".join(f"{(t - group.started) * 1000:.0f}" for t in group.arrived),
                (asyncio.get_running_loop().time() - group.started) * 1000,
            )
        live = [(r, f) for r, f in group.members if not f.done()]  # a caller gone (cancelled) is left out
        if not live:
            return
        task = asyncio.get_running_loop().create_task(self._answer(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        futures = [f for _, f in live]

        def gone(_: asyncio.Future[SectionVerdict]) -> None:
            # the call is wanted while one caller waits: each is bounded by its own deadline
            if all(f.cancelled() for f in futures):
                task.cancel()

        for future in futures:
            future.add_done_callback(gone)

    async def _answer(self, members: list[tuple[SectionRequest, asyncio.Future[SectionVerdict]]]) -> None:
        requests = [r for r, _ in members]
        outcomes: list[SectionVerdict | BaseException]
        try:
            if len(members) == 1:
                self._metrics.judge_calls.labels(self._label(requests[0].model)).inc()
                outcomes = [await self._alone(requests[0])]
            else:
                outcomes = await self._merged(requests)
        except Exception as exc:  # the call failed: every section of it fails alike
            outcomes = [exc] * len(members)
        now = asyncio.get_running_loop().time()
        for (request, future), outcome in zip(members, outcomes, strict=True):
            if not isinstance(outcome, BaseException) and request.run_id:
                self._answered[_repeat_key(request)] = (now, outcome)
                while len(self._answered) > _REPEATS:
                    self._answered.popitem(last=False)
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _merged(self, requests: list[SectionRequest]) -> list[SectionVerdict | BaseException]:
        """One call for every section; the failed sections once more, together."""
        model = self._label(requests[0].model)
        names = section_names(requests)
        out: list[SectionVerdict | BaseException | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        problems: dict[int, str] = {}
        for attempt in (1, 2):
            asked = [requests[i] for i in pending]
            asked_names = [names[i] for i in pending]
            prompt = merged_prompt(asked_names, asked)
            if attempt == 2:
                wrong = "; ".join(problems[i] for i in pending)
                prompt.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": f"Your last answer was invalid: {wrong}. Answer again."}
                        ],
                    }
                )
            attributes = {
                "procmesh.judge.sections": len(asked),
                "procmesh.judge.guards": ",".join(r.processor for r in asked),
                "procmesh.judge.attempt": attempt,
            }
            with tracing.span(f"procmesh.judge {model}", kind="client", attributes=attributes):
                text, finish, usage, model_id = await self._once(
                    asked[0], prompt, merged_schema(asked_names, asked)
                )
            if attempt == 1:  # a retry is a model call (procmesh_model_calls_total), not a plan's
                self._metrics.judge_calls.labels(model).inc()
                for saved in asked[1:]:
                    self._metrics.judge_calls_saved.labels(saved.processor, "merged").inc()
            still: list[int] = []
            for i, (value, problem), share in zip(
                pending, split(text, asked_names, asked), shares(usage, len(asked)), strict=True
            ):
                if problem is None:
                    out[i] = SectionVerdict(value, _json(value), share, model_id, finish, attempt, len(asked))
                else:
                    problems[i] = problem
                    still.append(i)
            pending = still
            if not pending:
                break
            log.warning("judge: %d of %d sections off-schema (try %d)", len(pending), len(asked), attempt)
        for i in pending:
            out[i] = Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "invalid_output",
                f"model {requests[i].model!r} did not answer section {names[i]!r} with JSON matching "
                f"its schema in 2 attempts: {problems[i]}",
            )
        return [o for o in out if o is not None]


def _repeat_key(request: SectionRequest) -> str:
    """The same question in the same run (a run-less call is never a repeat: run "" is many)."""
    return f"{request.run_id}\0{request.cache_key()}" if request.run_id else ""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
