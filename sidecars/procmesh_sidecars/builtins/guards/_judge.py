"""What the LLM-judged guards share: the judge call, verdicts, and applying them to messages and streams.

A guard asks a judge model (one of the orchestrator's models, reached through its model gateway
with the hook's ``model`` argument; the sidecar holds no provider key) for a verdict as JSON
matching a schema, and turns it into a `Verdict`: pass, warn, block, drop or replace. The same
verdict is applied to an input message (``processInput``) or to a window of the streamed answer
(``processOutputStream``).

Failures: a judge that times out or does not answer with JSON matching the schema (the gateway
retries once) fails the call, and the processor's failure policy decides (``onFailure:
fail-open`` lets the run go on, ``fail-closed`` ends it); the reference's ``errorStrategy``
option is that policy here. An input hook raises the error, and the orchestrator applies the
policy. The stream hook raises it under fail-closed only: under fail-open it lets every held
part go itself, unjudged and in order (a hook that raises cannot hand back parts it already
answered as dropped), reports the failure as a violation, and passes the rest of the step's
stream unjudged, as the orchestrator does with a stage that failed open.

Streams are judged per window (`_windows`), pipelined: a closed window's judge call runs as a task
while later parts keep arriving (each answered at once: held, or let go when nothing is held);
verdicts leave in window order, and the step's end waits for every one, letting each window's
parts go as its verdict comes (the SDK's ``release``: a partial result where the orchestrator
takes them), not all after the last window's. A verdict task is kept
per run, window id and text (a bounded map; ids are numbered in the run's state, which a rewind
puts back), so a window the SDK's rewind puts back finds its verdict,
and a window whose task is gone is judged again from the text its state kept.
An input message's verdict is kept per run, options and text (`_kept`): a ``processInput`` call
the orchestrator makes again in the run asks the gateway nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import grpc
from pydantic import Field, model_validator

from procmesh import JudgeSection, Processor
from procmesh.errors import ProcmeshError
from procmesh_sidecars.builtins._common import Chunk, Message, message_text
from procmesh_sidecars.builtins.guards import _windows
from procmesh_sidecars.builtins.guards._kept import KeptVerdicts
from procmesh_sidecars.builtins.guards._precheck import FLAGGED, Precheck, check_strategy
from procmesh_sidecars.builtins.guards._verdicts import (
    PASS,
    Verdict,
    apply_to_message,
    apply_to_window,
)
from procmesh_sidecars.builtins.guards._windows import WindowOptions

log = logging.getLogger(__name__)

Phase = Literal["input", "output"]

_MAX_TASKS = 4096
"""Verdict tasks kept per processor (windows of streams in flight, plus recent ones for rewinds)."""
_ASKED = "judge_first_asked"
"""Set in the run state once the step's first window's question was let go (`_hand_over`)."""
_FAILED_OPEN = "judge_failed_open"
"""Set in the run state when a judge failed under fail-open: the step's stream passes unjudged."""


class GuardOptions(WindowOptions):
    """Options every judged guard has (the reference's names in snake_case)."""

    model: str
    """The judge: a ``models`` key of the orchestrator's config or ``provider/model-id``."""
    instructions: str | None = None
    """The judge's system prompt (default: one written for the guard's categories or types)."""
    last_message_only: bool = False
    """Judge only the newest input message (the others pass unjudged)."""
    precheck: Precheck | None = None
    """Patterns that settle clear cases without the judge: ``{deny: [...], allow: [...]}``."""

    @model_validator(mode="after")
    def _precheck_strategy(self) -> GuardOptions:
        check_strategy(self.precheck, getattr(self, "strategy", None))  # each guard has its own
        return self

    judge_timeout: float | None = Field(default=None, gt=0)
    """Seconds a judge call may take (default: what is left of the hook call's deadline; 30 s in
    the stream, which has no per-call deadline)."""
    merge_judge: bool = True
    """Let the gateway judge this guard's question in one call with other guards' questions about
    the same text and judge model (its own section, its own verdict); false: always a call alone."""


@dataclass(frozen=True)
class Question:
    """What a guard asks about `text` apart from the text: its section when the gateway merges it
    with other guards' questions about the same text (`JudgeSection`)."""

    text: str
    phase: Phase
    question: str


async def ask(
    model: Any,
    options: GuardOptions,
    system: str,
    prompt: str,
    schema: Mapping[str, Any],
    question: Question,
) -> dict[str, Any]:
    """The judge's answer: a JSON object matching `schema` (temperature 0, as the reference asks).

    `prompt` is the guard's question with the text, as asked alone; with ``merge_judge`` the
    gateway may ask `question` in one call with other guards' questions about the same text.
    """
    section = None
    if options.merge_judge:
        section = JudgeSection(question.text, system, question.question, question.phase)
    result = await model(options.model).generate(
        [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        schema=schema,
        temperature=0,
        timeout=options.judge_timeout,
        section=section,
    )
    answer = result.object
    return answer if isinstance(answer, dict) else {}


def scored(
    items: list[dict[str, Any]] | None, key: str, threshold: float
) -> tuple[dict[str, float], list[str]]:
    """A judge's ``[{<key>, score}]`` as ``{name: score}`` and the names at or over `threshold`."""
    scores = {str(item[key]): float(item["score"]) for item in items or []}
    return scores, [name for name, score in scores.items() if score >= threshold]


def flag_message(heading: str, names: list[str], reason: Any, scores: dict[str, float] | None) -> str:
    """The reference's message: ``<heading>: a, b. Reason: ...`` (``. Scores: a: 0.9, ...``)."""
    message = f"{heading}: {', '.join(names)}"
    if reason:
        message += f". Reason: {reason}"
    if scores is not None:
        message += ". Scores: " + ", ".join(f"{name}: {score}" for name, score in scores.items())
    return message


def quoted(text: str, phase: Phase) -> str:
    """The content line of a judge prompt; a window of a streamed answer says what it is."""
    where = (
        "This is one part of an answer being streamed; judge it as it stands.\n" if phase == "output" else ""
    )
    return f'{where}Content: "{text}"'


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` or null (the reference's ``.nullable()``)."""
    return {"anyOf": [schema, {"type": "null"}]}


def verdict_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A closed JSON object schema requiring every one of `properties`."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


class JudgedGuard(Processor):
    """Base of the five guards: input messages judged one call each, streams judged per window.

    A subclass sets `id`, `Options` and implements `verdict`; `holds` says whether a
    strategy changes or stops text (then a window's parts wait for its verdict) or only reports.
    It takes its hooks from `InputHook` and `StreamHook` (a processor declares the hooks it has,
    so each guard mixes in only the lanes the reference gives it).
    """

    speculative: ClassVar[bool] = True
    """A judge call is a read: its answer is data, and the guard's stream windows live in its
    state, so a discarded or rewound call changes nothing."""

    def __init__(self) -> None:
        # keyed by run, window id and text: a rewind into an open window gives it other text to close on
        self._tasks: OrderedDict[tuple[str, str, str], asyncio.Task[Verdict]] = OrderedDict()
        self._input_verdicts: KeptVerdicts[Verdict] = KeptVerdicts(_MAX_TASKS)

    async def verdict(self, text: str, options: Any, model: Any, phase: Phase) -> Verdict:
        """Judge `text` (an input message's, or a window of the answer) under `options`."""
        raise NotImplementedError

    async def _decide(self, text: str, options: Any, model: Any, phase: Phase) -> Verdict:
        """`verdict`, unless the guard's pre-check settles `text` without the judge (then the
        gateway is told, in the background, so ``procmesh_judge_calls_saved_total{by="precheck"}``
        counts the call not made)."""
        settled = options.precheck.settle(text) if options.precheck is not None else None
        if settled is None:
            return await self.verdict(text, options, model, phase)
        kind, index = settled
        model(options.model).report_saved()  # counted by the orchestrator with the calls it saved
        if kind == "allow":
            return PASS
        detail = self.detail(options, phase, precheck="deny", pattern=index)
        return Verdict(FLAGGED[options.strategy], f"Content flagged by the pre-check of {self.id}", detail)

    def holds(self, options: Any) -> bool:
        """Whether streamed text waits for its verdict (every strategy but warn)."""
        return bool(options.strategy != "warn")

    def detail(self, options: Any, phase: Phase, **found: Any) -> dict[str, Any]:
        """A violation's detail: who, where, the strategy, and what the guard found."""
        return {"processorId": self.id, "phase": phase, "strategy": options.strategy, **found}

    def min_length(self, options: Any) -> int:
        """Texts shorter than this are not judged (empty ones never are)."""
        return 1

    # -- input messages ---------------------------------------------------------------------

    async def judge_messages(
        self,
        messages: list[Message],
        options: Any,
        model: Any,
        abort: Any,
        report: Any,
        run_id: str = "",
    ) -> list[Message] | None:
        """Judge each selected message (concurrently) and apply the verdicts in order; a text the
        run's earlier call of this guard judged under the same options keeps its verdict."""
        selected = messages[-1:] if options.last_message_only else messages
        chosen = {id(m) for m in selected}
        texts = [message_text(m).strip() if id(m) in chosen else "" for m in messages]
        judged = [bool(t) and len(t) >= self.min_length(options) for t in texts]
        # What the judge must answer goes first: a conversation re-sends its history every turn,
        # whose verdicts the gateway's cache holds, beside its new message and the last answer
        # (new to the input guards). Asked in order, those questions waited behind every cached
        # one (70 ms of a ten-turn history under load); asked after the newest message alone,
        # the last answer's still waited behind the history's work of every guard in the sidecar
        # (P8's tenth turn: at the judge 60-70 ms in, against 25 for the new message's).
        asked = [t for t, j in zip(texts, judged, strict=True) if j][::-1]
        verdicts: list[Verdict] = []
        if asked:
            key = options.model_dump_json()
            known = [i > 0 and self._input_verdicts.asked_before(key, t) for i, t in enumerate(asked)]

            def ask(text: str) -> asyncio.Future[Verdict]:
                return asyncio.ensure_future(self._input_verdict(text, key, model, run_id, options))

            tasks = {i: ask(t) for i, t in enumerate(asked) if not known[i]}
            if any(known):
                await _hand_over()
                tasks.update({i: ask(t) for i, t in enumerate(asked) if known[i]})
            verdicts = (await asyncio.gather(*(tasks[i] for i in range(len(asked)))))[::-1]
        out: list[Message] = []
        changed = False
        pending = iter(verdicts)
        for message, j in zip(messages, judged, strict=True):
            if not j:
                out.append(message)
                continue
            verdict = next(pending)
            result = apply_to_message(message, verdict, abort, report)
            changed = changed or result is not message
            if result is not None:
                out.append(result)
        return out if changed else None

    async def _input_verdict(self, text: str, key: str, model: Any, run_id: str, options: Any) -> Verdict:
        decide = lambda: self._decide(text, options, model, "input")  # noqa: E731
        return await self._input_verdicts.get(run_id, key, text, decide)

    # -- the stream -------------------------------------------------------------------------

    async def judge_stream(
        self,
        part: Chunk,
        options: Any,
        state: dict[str, Any],
        model: Any,
        abort: Any,
        report: Any,
        on_failure: str | None,
        run_id: str = "",
        release: Any = None,
    ) -> Chunk | list[Chunk] | None:
        """One streamed part: held, let go, or (at the step's end) everything judged and let go.

        `on_failure` is the processor's failure policy: under ``fail-open`` a failed judge call
        lets everything go unjudged (`_fail_open`) instead of failing the hook. `run_id` scopes
        the verdicts kept per window (window ids are numbered per run). `release` (the SDK's)
        lets each window's parts go at the step's end as its verdict comes.
        """
        kind = str(part.get("type", ""))
        if state.get(_FAILED_OPEN):
            if kind in _windows.STEP_ENDS:
                del state[_FAILED_OPEN]  # the next step is judged again, as a failed-open stage's is
            return part
        fail_open = on_failure == "fail-open"
        hold = self.holds(options)
        if kind == "text-delta":
            closed_windows = _windows.add_text(state, part, options, hold=hold)
            for window in closed_windows:
                self._judge(window, options, model, run_id)
            if closed_windows and not state.get(_ASKED):
                state[_ASKED] = True  # the step's first question: the first chunk waits for it
                await _hand_over()
            out = await self._release(
                state, options, model, abort, report, run_id, wait=False, fail_open=fail_open
            )
            return out if hold else [*out, part]
        closed = _windows.close_open(state)
        if closed is not None:
            self._judge(closed, options, model, run_id)
        if kind in _windows.STEP_ENDS:
            out = await self._release(
                state, options, model, abort, report, run_id, wait=True, fail_open=fail_open, now=release
            )
            state.pop(_FAILED_OPEN, None)  # failed at the step's end: the step is over
            state.pop(_ASKED, None)
            return [*out, part]
        held = _windows.hold_behind(state, part)
        out = await self._release(
            state, options, model, abort, report, run_id, wait=False, fail_open=fail_open
        )
        return out if held else [*out, part]

    def _judge(self, window: _windows.Window, options: Any, model: Any, run_id: str) -> asyncio.Task[Verdict]:
        """The window's verdict task (started now unless it runs already)."""
        key = (run_id, str(window["id"]), str(window["text"]))
        task = self._tasks.get(key)
        if task is None or task.cancelled() or _withdrawn(task):
            task = asyncio.create_task(self._decide(window["text"], options, model, "output"))
            task.add_done_callback(_retrieve)
            self._tasks[key] = task
            while len(self._tasks) > _MAX_TASKS:
                _, old = self._tasks.popitem(last=False)
                old.cancel()
        return task

    async def _release(
        self,
        state: dict[str, Any],
        options: Any,
        model: Any,
        abort: Any,
        report: Any,
        run_id: str,
        *,
        wait: bool,
        fail_open: bool,
        now: Any = None,
    ) -> list[Chunk]:
        """The parts of every judged window at the head, in order (all of them when `wait`);
        with `now` (``release``) each window's go through it as its verdict comes, the rest
        (a fail-open's) are returned."""
        out: list[Chunk] = []
        let_go = now if now is not None else out.extend
        while (window := _windows.head(state)) is not None:
            if not window["text"]:
                _windows.pop_head(state)
                let_go(list(window["parts"]))
                continue
            task = self._judge(window, options, model, run_id)
            if not task.done() and not wait:
                break
            try:
                # shielded: a session cancelled while it waits (a rehearsal the orchestrator
                # discarded) leaves the verdict to the session that asks next about the window
                verdict = await asyncio.shield(task)
            except ProcmeshError as exc:  # the judge call failed (the model gateway's error)
                if _withdrawn(task):
                    continue  # asked again: this session's text is not the failed call's
                if not fail_open:
                    raise  # fail-closed: the orchestrator ends the run
                return out + self._fail_open(state, options, report, exc)
            _windows.pop_head(state)  # its task stays (bounded): a rewind that puts it back reuses it
            let_go(apply_to_window(window, verdict, abort, report))
        return out

    def _fail_open(self, state: dict[str, Any], options: Any, report: Any, exc: ProcmeshError) -> list[Chunk]:
        """A judge failed under fail-open: every held part, unjudged, in order; the step passes.

        Raising would lose the held parts: the orchestrator's failed-open stage passes on only
        the parts still awaiting an answer, and these were answered (as dropped) when held.
        """
        held = _windows.windows(state)
        parts = [p for window in held for p in window["parts"]]
        held.clear()
        state[_FAILED_OPEN] = True
        message = f"Judge failed; the rest of the answer's step passes unjudged (fail-open): {exc}"
        log.warning("%s: %s", self.id, message)
        report(message, self.detail(options, "output", error=str(exc), released=len(parts)))
        return parts


async def _hand_over() -> None:
    """Let the question just asked leave alone, then let the sidecar's other hooks run.

    The guards of a lane are called at once, and the sidecar runs their hooks one after another
    (the CPU is one): each went through its whole request before the next started, the loop
    running nothing else while no hook awaited (a stream request can carry hundreds of parts: the
    optimistic first step hands over the whole kept answer at once). So the last input guard's
    question about the new message, which the judge must answer and the planner's group waits
    for, left after every guard's history (1.5-2 ms of work each; 36-55 ms into P8's tenth turn),
    and an output guard's question about the step's first window after its request's last part.
    The question's task needs a turn of the loop to ask, the gateway client one to send
    (`_model_batch`) and gRPC one to start the call; then a short sleep (the hook's loop idle,
    its turn ends): each guard's question leaves before any guard's other work.
    """
    for _ in range(_TURNS_TO_SEND):
        await asyncio.sleep(0)
    await asyncio.sleep(_HAND_OVER_SECONDS)


_TURNS_TO_SEND = 4
_HAND_OVER_SECONDS = 0.0005


def _withdrawn(task: asyncio.Task[Verdict]) -> bool:
    """Whether the gateway withdrew the task's question (CANCELLED): the model call whose text it
    judged failed (or its run ended). A session of the retried call reaching a window with the
    same id and text asks again rather than taking the withdrawal for its verdict."""
    if not task.done() or task.cancelled():
        return False
    return getattr(task.exception(), "status", None) == grpc.StatusCode.CANCELLED


def _retrieve(task: asyncio.Task[Verdict]) -> None:
    """Read a finished task's exception, so one never awaited (a rewound window) logs nothing."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("judge call failed: %s", task.exception())


class InputHook(JudgedGuard):
    """``processInput``: each input message judged (`JudgedGuard.judge_messages`)."""

    async def process_input(
        self,
        messages: list[Message],
        options: Any,
        model: Any,
        abort: Any,
        report_violation: Any,
        run_id: str,
    ) -> list[Message] | None:
        return await self.judge_messages(messages, options, model, abort, report_violation, run_id)


class StreamHook(JudgedGuard):
    """``processOutputStream``: the answer judged per window (`JudgedGuard.judge_stream`)."""

    async def process_output_stream(
        self,
        part: Chunk,
        options: Any,
        state: dict[str, Any],
        model: Any,
        abort: Any,
        report_violation: Any,
        on_failure: str | None,
        run_id: str,
        release: Any,
    ) -> Chunk | list[Chunk] | None:
        return await self.judge_stream(
            part, options, state, model, abort, report_violation, on_failure, run_id, release
        )
