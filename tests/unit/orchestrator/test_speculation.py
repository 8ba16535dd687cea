"""The lane walker (`run.speculation`): batches, commit order, discards, against a fake caller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from procmesh_orchestrator.errors import ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import AgentSpec
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import (
    Attempt,
    Chunk,
    Effects,
    HookArgs,
    InputResult,
    Processor,
    Reply,
    RunInfo,
    StreamItem,
)
from procmesh_orchestrator.run.speculation import plan, walk
from procmesh_orchestrator.run.types import CallOptions
from tests.unit.orchestrator.run.fakes import FakeModel

HOOK = "process_input"


@dataclass(frozen=True)
class P:
    """A lane entry whose answer to an input (the text so far) is `answer(text)`."""

    processor_id: str
    speculative: bool = True
    fuse_key: str = ""
    answer: Callable[[str], tuple[str | None, Effects]] = lambda text: (None, Effects())
    fail: bool = False
    judged: bool = False

    @property
    def key(self) -> str:
        return self.processor_id

    @property
    def source(self) -> tuple[str, str]:
        return ("s", self.processor_id)

    def has(self, hook: str) -> bool:
        return hook == HOOK

    def expand(self, request_context: Mapping[str, Any]) -> tuple[P, ...]:
        return (self,)


@dataclass(frozen=True)
class Args(HookArgs[str | None]):
    hook = HOOK
    text: str


@dataclass
class FakeAttempt:
    log: list[str]
    item: P
    text: str
    result: str | None
    effects: Effects

    def commit(self) -> Reply[Any]:
        self.log.append(f"commit {self.item.processor_id} on {self.text!r}")
        if self.item.fail:
            raise ProcessorFailedError(self.item.processor_id, HOOK, "boom")
        return Reply(InputResult() if self.result is None else self.result, self.effects)

    def discard(self) -> None:
        self.log.append(f"discard {self.item.processor_id}")


@dataclass
class FakeCaller:
    """Answers at once; records every send (with the processors it named) and every commit."""

    log: list[str] = field(default_factory=list)
    sent: list[tuple[list[str], str]] = field(default_factory=list)
    hang: set[str] = field(default_factory=set)
    """Processors whose call never answers (a cancel is what ends it)."""
    cancelled: list[str] = field(default_factory=list)

    async def call(self, item: Processor, args: HookArgs[Any]) -> Reply[Any]:
        raise AssertionError("Batchable entries are sent, not called")

    def send(
        self, group: Sequence[Processor], args: HookArgs[Any], *, speculative: bool = False
    ) -> asyncio.Task[list[Attempt[Any]]]:
        assert isinstance(args, Args)
        items = [p for p in group if isinstance(p, P)]
        self.sent.append(([p.processor_id for p in items], args.text))

        async def answer() -> list[Attempt[Any]]:
            if any(p.processor_id in self.hang for p in items):
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.cancelled += [p.processor_id for p in items]
                    raise
            out: list[Attempt[Any]] = []
            text = args.text
            for p in items:  # a fused request runs on while each leaves its input unchanged
                result, effects = p.answer(text)
                out.append(FakeAttempt(self.log, p, text, result, effects))
                if result is not None or effects.abort is not None:
                    break
            return out

        return asyncio.create_task(answer())

    def fail(self, item: Processor, hook: str, cause: str) -> None:
        raise AssertionError("not used")

    def export_states(self) -> dict[str, Any]:
        return {}

    def import_states(self, states: dict[str, Any]) -> None:
        pass

    def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        raise AssertionError("not used")


def make_run(caller: FakeCaller, *, fuse: bool = True) -> RunCore:
    def factory(info: RunInfo, metrics: OrchestratorMetrics) -> FakeCaller:
        return caller

    spec = AgentSpec(id="a", model=FakeModel(), hook_caller=factory, fuse=fuse)
    return RunCore(spec, "hi", CallOptions(), sink=None, metrics=OrchestratorMetrics())


def rewrite(old: str, new: str) -> Callable[[str], tuple[str | None, Effects]]:
    return lambda text: (text.replace(old, new), Effects()) if old in text else (None, Effects())


def abort_on(word: str) -> Callable[[str], tuple[str | None, Effects]]:
    def answer(text: str) -> tuple[str | None, Effects]:
        if word in text:
            return None, Effects(abort=TripwireAbort("x", "no", False, None, HOOK))
        return None, Effects()

    return answer


async def run_lane(run: RunCore, lane: list[P]) -> str:
    text = "a b c"

    def build(item: Processor) -> Args:
        return Args(text)

    async def apply(item: Processor, args: Args, result: Any, effects: Effects) -> bool:
        nonlocal text
        if isinstance(result, str):
            text = result
        await run.apply(effects, can_stream=False)
        return False

    await walk(run, lane, HOOK, build, apply)
    return text


def ids(units: list[list[Processor]]) -> list[list[str]]:
    return [[p.key for p in unit] for unit in units]


def test_plan_sends_the_first_and_the_speculative_ones_after_it() -> None:
    lane = [P("a", speculative=False), P("b"), P("c"), P("d", speculative=False), P("e")]
    assert ids(plan(lane, 0, fuse=True)) == [["a"], ["b"], ["c"]]
    assert ids(plan(lane, 3, fuse=True)) == [["d"], ["e"]]


def test_plan_holds_a_processor_id_once() -> None:
    lane = [P("a"), P("b"), P("a"), P("c")]
    assert ids(plan(lane, 0, fuse=True)) == [["a"], ["b"]]


def test_plan_fuses_neighbours_of_one_sidecar() -> None:
    lane = [
        P("a", speculative=False, fuse_key="s"),
        P("b", speculative=False, fuse_key="s"),
        P("c", fuse_key="t"),
    ]
    assert ids(plan(lane, 0, fuse=True)) == [["a", "b"], ["c"]]
    assert ids(plan(lane, 0, fuse=False)) == [["a"]]  # b is not speculative: it waits for a
    # a later request must be speculative throughout: the sidecar's non-speculative one waits
    lane = [P("x"), P("a", fuse_key="s"), P("b", speculative=False, fuse_key="s")]
    assert ids(plan(lane, 0, fuse=True)) == [["x"], ["a"]]


def test_plan_sends_judges_only_after_the_cheap_entries_in_front_of_them() -> None:
    lane = [P("regex", speculative=False), P("tokens"), P("mod", judged=True), P("pii", judged=True), P("x")]
    assert ids(plan(lane, 0, fuse=True)) == [["regex"], ["tokens"]]
    # the judges' own batch: the judges and the cheap entries after them go together
    assert ids(plan(lane, 2, fuse=True)) == [["mod"], ["pii"], ["x"]]
    assert ids(plan(lane, 0, fuse=True, cheap_first=False)) == [
        ["regex"],
        ["tokens"],
        ["mod"],
        ["pii"],
        ["x"],
    ]
    # a judge in front: nothing waits (a later trip cancels the judges after it instead)
    lane = [P("mod", judged=True), P("regex"), P("pii", judged=True)]
    assert ids(plan(lane, 0, fuse=True)) == [["mod"], ["regex"], ["pii"]]


async def test_a_cheap_trip_means_no_judge_is_asked_and_counts_them_saved() -> None:
    caller = FakeCaller(hang={"mod", "pii"})  # a judge asked would hang the test
    run = make_run(caller)
    lane = [P("regex", answer=abort_on("b")), P("mod", judged=True), P("pii", judged=True)]
    with pytest.raises(TripwireAbort):
        await run_lane(run, lane)
    assert caller.sent == [(["regex"], "a b c")]
    for judge in ("mod", "pii"):
        assert run.metrics.total("procmesh_judge_calls_saved_total", processor=judge, by="cheap-first") == 1


async def test_cheap_first_gives_what_the_sequential_walk_gives() -> None:
    lane = [P("regex", answer=rewrite("a", "A")), P("mod", judged=True, answer=rewrite("b", "B")), P("x")]
    caller = FakeCaller()
    assert await run_lane(make_run(caller), lane) == "A B c"
    assert caller.sent == [(["regex"], "a b c"), (["mod"], "A b c"), (["x"], "A b c"), (["x"], "A B c")]
    assert caller.log == [
        "commit regex on 'a b c'",
        "commit mod on 'A b c'",
        "discard x",
        "commit x on 'A B c'",
    ]


async def test_answers_commit_in_lane_order_when_nothing_changes() -> None:
    caller = FakeCaller()
    run = make_run(caller)
    assert await run_lane(run, [P("a"), P("b"), P("c")]) == "a b c"
    assert caller.sent == [(["a"], "a b c"), (["b"], "a b c"), (["c"], "a b c")]
    assert caller.log == ["commit a on 'a b c'", "commit b on 'a b c'", "commit c on 'a b c'"]


async def test_a_rewrite_discards_the_later_answers_and_sends_them_again() -> None:
    caller = FakeCaller()
    run = make_run(caller)
    text = await run_lane(run, [P("a"), P("b", answer=rewrite("b", "B")), P("c"), P("d")])
    assert text == "a B c"
    assert caller.sent == [
        (["a"], "a b c"),
        (["b"], "a b c"),
        (["c"], "a b c"),
        (["d"], "a b c"),
        (["c"], "a B c"),
        (["d"], "a B c"),
    ]
    assert caller.log == [
        "commit a on 'a b c'",
        "commit b on 'a b c'",
        "discard c",
        "discard d",
        "commit c on 'a B c'",
        "commit d on 'a B c'",
    ]


async def test_an_abort_discards_and_cancels_every_later_call() -> None:
    caller = FakeCaller(hang={"d"})
    run = make_run(caller)
    with pytest.raises(TripwireAbort):
        await run_lane(run, [P("a"), P("b", answer=abort_on("a")), P("c"), P("d")])
    assert caller.log == ["commit a on 'a b c'", "commit b on 'a b c'", "discard c"]
    assert caller.cancelled == ["d"]
    discarded = run.metrics.total(
        "procmesh_speculative_calls_total", processor="d", hook=HOOK, outcome="discarded"
    )
    assert discarded == 1


async def test_a_fail_closed_failure_discards_the_later_answers() -> None:
    caller = FakeCaller()
    run = make_run(caller)
    with pytest.raises(ProcessorFailedError):
        await run_lane(run, [P("a", fail=True), P("b"), P("c")])
    assert caller.log == ["commit a on 'a b c'", "discard b", "discard c"]


async def test_a_fused_request_that_stopped_goes_on_from_the_next_processor() -> None:
    caller = FakeCaller()
    run = make_run(caller)
    lane = [P("a", fuse_key="s"), P("b", fuse_key="s", answer=rewrite("a", "A")), P("c", fuse_key="s")]
    assert await run_lane(run, lane) == "A b c"
    assert caller.sent == [(["a", "b", "c"], "a b c"), (["c"], "A b c")]
    assert caller.log == ["commit a on 'a b c'", "commit b on 'a b c'", "commit c on 'A b c'"]


async def test_a_non_speculative_processor_gets_final_input_only() -> None:
    caller = FakeCaller()
    run = make_run(caller)
    lane = [P("a", answer=rewrite("a", "A")), P("b"), P("guard", speculative=False), P("c")]
    assert await run_lane(run, lane) == "A b c"
    assert [text for names, text in caller.sent if names == ["guard"]] == ["A b c"]
