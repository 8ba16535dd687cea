"""The judge planner's plan and coalescing (service/grpc/judge_planner.py), with the model call
played by a recorder: which sections went out together, and what each guard got back.
The gateway around it, real sidecars and a real judge server: tests/e2e/guards/test_merged_judge.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.service.grpc.judge_plan import JudgePlan
from procmesh_orchestrator.service.grpc.judge_planner import JudgePlanner
from procmesh_orchestrator.service.grpc.judge_sections import Refused, SectionRequest, SectionVerdict

SCHEMA = {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"]}


_BUILTINS = {"moderation": "moderation", "pii": "pii-detector", "injection": "prompt-injection-detector"}


def _guard(name: str, model: str = "judge", **options: Any) -> dict[str, Any]:
    """A built-in guard (the plan models their skip rules), its instance named `name`."""
    return {"processor": f"builtins/{_BUILTINS[name]}", "name": name, "options": {"model": model, **options}}


CONFIG = Config.model_validate(
    {
        "sidecars": {"g": {"address": "unix:///run/procmesh/guards.sock"}},
        "agents": {
            "three": {
                "model": "demo",
                "inputProcessors": [_guard("moderation"), _guard("pii"), _guard("injection")],
                "outputProcessors": [
                    _guard("moderation"),
                    {**_guard("pii", merge_judge=False), "name": "pii-out"},
                ],
            },
            "one": {"model": "demo", "inputProcessors": [_guard("moderation")]},
            # injection may settle a text without the judge, pii judges the newest message only
            "unsure": {
                "model": "demo",
                "inputProcessors": [
                    _guard("moderation"),
                    _guard("pii", last_message_only=True),
                    _guard("injection", precheck={"deny": ["x"]}),
                ],
            },
        },
    }
)


def _request(
    guard: str, content: str = "hello", agent: str | None = "three", run: str = "r1"
) -> SectionRequest:
    return SectionRequest(
        guard_id=guard,
        processor=guard,
        model="judge",
        run_id=run,
        resource=None,
        phase="input",
        content=content,
        instructions=f"You are {guard}.",
        question=f"Ask {guard}.",
        schema=SCHEMA,
        messages=({"role": "user", "content": f"{guard}: {content}"},),
        settings={"temperature": 0},
        agent=agent,
    )


class Judge:
    """The model, as the planner calls it: merged prompts (`once`) and calls alone (`alone`)."""

    def __init__(self, answers: dict[str, Any] | None = None, delay: float = 0.0) -> None:
        self.answers = answers or {}
        """A guard's section answer (default {"flag": False}); a str is sent as it is."""
        self.delay = delay
        self.merged: list[list[str]] = []
        self.alone: list[str] = []
        self.cancelled = 0
        self.asked = asyncio.Event()

    async def once(
        self, request: SectionRequest, prompt: list[dict[str, Any]], schema: dict[str, Any]
    ) -> tuple[str, str, dict[str, int], str]:
        names = list(schema["properties"])
        self.merged.append(names)
        self.asked.set()
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        answer = {n: self.answers.get(n, {"flag": False}) for n in names}
        return json.dumps(answer), "stop", {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13}, "m"

    async def alone_call(self, request: SectionRequest) -> SectionVerdict:
        self.alone.append(request.guard_id)
        return SectionVerdict({"flag": True}, '{"flag": true}', {}, "m", "stop", 1, 1)


class LoopClock:
    """The running loop's clock, moved only by the test.

    The planner times its groups with the loop (`loop.time`, `loop.call_at`): on this clock a
    window passes when the test says so, not when a loaded machine gets round to it (two cores
    at load 15 once woke a 30 ms sleep after the 50 ms window, and the group went out short).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        monkeypatch.setattr(loop, "time", lambda: self.now)

    async def advance(self, seconds: float) -> None:
        """Let what is ready run (the requests sent so far reach the planner), then move the
        clock on and let what came due run (a group's timer, the call it makes)."""
        await _settle()
        self.now += seconds
        await _settle()


async def _settle() -> None:
    """Give every ready callback and task its turns; no time passes on a `LoopClock`."""
    for _ in range(20):
        await asyncio.sleep(0)


def _planner(judge: Judge, metrics: OrchestratorMetrics, window: float = 0.05) -> JudgePlanner:
    return JudgePlanner(lambda: CONFIG, judge.once, judge.alone_call, metrics, lambda m: m, window=window)


@pytest.fixture
def metrics() -> OrchestratorMetrics:
    return OrchestratorMetrics(CollectorRegistry())


def test_the_plan_counts_each_agents_lane_entries_on_one_judge_model() -> None:
    plan = JudgePlan.of(CONFIG)
    assert plan.count(_request("moderation")) == 3
    assert plan.count(_request("moderation", agent="one")) == 1
    assert plan.count(_request("moderation", agent=None)) == 3  # not live here: the most any agent has
    out = SectionRequest(**{**_request("moderation").__dict__, "phase": "output"})
    assert plan.count(out) == 1  # pii opted out of merging


async def test_the_sections_a_lane_plans_go_out_in_one_call(metrics: OrchestratorMetrics) -> None:
    judge = Judge({"pii": {"flag": True}})
    planner = _planner(judge, metrics, window=30)  # the plan, not the window, sends it
    verdicts = await asyncio.gather(*(planner.judge(_request(g)) for g in ("moderation", "pii", "injection")))
    assert judge.merged == [["moderation", "pii", "injection"]]
    assert [v.value for v in verdicts] == [{"flag": False}, {"flag": True}, {"flag": False}]
    assert [v.sections for v in verdicts] == [3, 3, 3]
    assert sum(v.usage["totalTokens"] for v in verdicts) == 13  # the call's tokens, shared out
    assert metrics.judge_calls.labels("judge")._value.get() == 1
    assert metrics.judge_calls_saved.labels("pii", "merged")._value.get() == 1
    assert metrics.judge_calls_saved.labels("moderation", "merged")._value.get() == 0  # the first paid


async def test_a_lone_guard_is_judged_alone_at_once(metrics: OrchestratorMetrics) -> None:
    judge = Judge()
    planner = _planner(judge, metrics, window=30)
    verdict = await asyncio.wait_for(planner.judge(_request("moderation", agent="one")), 5)
    assert (judge.alone, judge.merged, verdict.sections) == (["moderation"], [], 1)


async def test_the_window_sends_what_came_when_the_plan_expects_more(metrics: OrchestratorMetrics) -> None:
    judge = Judge()
    planner = _planner(judge, metrics, window=0.01)
    await asyncio.gather(planner.judge(_request("moderation")), planner.judge(_request("pii")))
    assert judge.merged == [["moderation", "pii"]]


async def test_other_content_or_another_run_is_another_call(metrics: OrchestratorMetrics) -> None:
    judge = Judge()
    planner = _planner(judge, metrics, window=0.01)
    await asyncio.gather(
        planner.judge(_request("moderation")),
        planner.judge(_request("pii", content="other")),
        planner.judge(_request("injection", run="r2")),
    )
    assert sorted(judge.alone) == ["injection", "moderation", "pii"]  # three groups: their timers race
    assert judge.merged == []


async def test_a_malformed_section_fails_only_its_guard_after_one_retry(metrics: OrchestratorMetrics) -> None:
    judge = Judge({"pii": "not an object"})
    planner = _planner(judge, metrics, window=30)
    results = await asyncio.gather(
        *(planner.judge(_request(g)) for g in ("moderation", "pii", "injection")), return_exceptions=True
    )
    assert judge.merged == [["moderation", "pii", "injection"], ["pii"]]  # the retry asks for it alone
    assert [r.value for r in results if isinstance(r, SectionVerdict)] == [{"flag": False}] * 2
    error = results[1]
    assert isinstance(error, Refused)
    assert (error.code, error.outcome) == (grpc.StatusCode.FAILED_PRECONDITION, "invalid_output")
    assert "'pii'" in str(error)


async def test_a_failed_call_fails_every_section_in_it(metrics: OrchestratorMetrics) -> None:
    async def down(*_: Any) -> Any:
        raise Refused(grpc.StatusCode.UNAVAILABLE, "api_error", "the provider is down")

    planner = JudgePlanner(lambda: CONFIG, down, Judge().alone_call, metrics, lambda m: m, window=30)
    results = await asyncio.gather(
        *(planner.judge(_request(g)) for g in ("moderation", "pii", "injection")), return_exceptions=True
    )
    assert [getattr(r, "outcome", None) for r in results] == ["api_error"] * 3


async def test_the_call_is_cancelled_once_no_caller_waits(metrics: OrchestratorMetrics) -> None:
    judge = Judge(delay=30)
    planner = _planner(judge, metrics, window=30)
    calls = [asyncio.ensure_future(planner.judge(_request(g))) for g in ("moderation", "pii", "injection")]
    await judge.asked.wait()
    calls[0].cancel()
    await asyncio.sleep(0.01)
    assert judge.cancelled == 0  # two callers still wait for it
    for call in calls[1:]:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert judge.cancelled == 1


async def test_the_same_question_asked_again_in_the_run_is_answered_at_once(
    metrics: OrchestratorMetrics,
) -> None:
    judge = Judge({"pii": {"flag": True}})
    planner = _planner(judge, metrics, window=30)
    await asyncio.gather(*(planner.judge(_request(g)) for g in ("moderation", "pii", "injection")))
    # a discarded speculative call asked again: no call, no wait for a group the plan expects
    again = await asyncio.wait_for(planner.judge(_request("pii")), 5)
    assert again.value == {"flag": True}
    assert judge.merged == [["moderation", "pii", "injection"]]
    assert metrics.judge_calls_saved.labels("pii", "repeat")._value.get() == 1
    # another run's question is its own (a lone guard there: judged alone at once)
    await asyncio.wait_for(planner.judge(_request("pii", agent="one", run="r2")), 5)
    assert judge.alone == ["pii"]


async def test_a_lane_still_sending_keeps_its_groups_waiting(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = LoopClock(monkeypatch)
    judge = Judge()
    planner = _planner(judge, metrics, window=0.05)
    first = asyncio.ensure_future(planner.judge(_request("moderation", content="m1")))
    # moderation's questions about other messages keep coming, 30 ms apart, for 150 ms
    others = []
    for i in range(5):
        await clock.advance(0.03)
        others.append(asyncio.ensure_future(planner.judge(_request("moderation", content=f"m{i + 2}"))))
    # m1's group, 150 ms old, still waits: its lane is not done
    assert (judge.merged, judge.alone) == ([], [])
    late = [asyncio.ensure_future(planner.judge(_request(g, content="m1"))) for g in ("pii", "injection")]
    await asyncio.gather(first, *late)
    assert ["moderation", "pii", "injection"] in judge.merged
    await clock.advance(0.05)  # the lane is quiet for its window
    # pii and injection ask about every message (known to ask): the rest wait for them to the cap
    assert judge.alone == []
    await clock.advance(1.0)
    await asyncio.gather(*others)
    assert judge.alone == ["moderation"] * 5


@pytest.mark.parametrize("at_once", [False, True])
async def test_questions_the_cache_answers_keep_their_lane_waiting(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    # the gateway calls `sending` for each sectioned request before its verdict cache looks it up;
    # `cached` for one the cache answers in the step that reads it (the gateway's fast path)
    clock = LoopClock(monkeypatch)
    judge = Judge()
    planner = _planner(judge, metrics, window=0.2)
    first = asyncio.ensure_future(planner.judge(_request("injection", content="new")))
    hit = mpb.ModelServiceGenerateRequest(model="judge", run_id="r1", processor_id="moderation")
    hit.section.CopyFrom(mpb.JudgeSection(content="old", instructions="i", question="q", phase="input"))
    for _ in range(5):  # 250 ms of the lane's questions about the history, answered from the cache
        await clock.advance(0.05)
        (planner.cached if at_once else planner.sending)(hit, None, {"temperature": 0})
    assert judge.alone == []  # the group, older than its window, still waits
    assert judge.merged == []
    late = [asyncio.ensure_future(planner.judge(_request(g, content="new"))) for g in ("moderation", "pii")]
    await asyncio.gather(first, *late)
    assert judge.merged == [["injection", "moderation", "pii"]]


def test_the_plan_knows_which_guards_ask_about_every_text() -> None:
    plan = JudgePlan.of(CONFIG)
    ids = {frozenset({g, p}) for g, p in _BUILTINS.items()}
    assert plan.sure(_request("moderation")) == ids
    assert plan.sure(_request("moderation", agent="unsure")) == {frozenset({"moderation"})}
    assert plan.sure(_request("moderation", content="")) == frozenset()  # no guard asks about ""
    assert plan.sure(_request("moderation", agent=None)) == frozenset()  # not live here: nobody's


def _two_asked(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch, agent: str
) -> tuple[LoopClock, Judge, JudgePlanner, list[asyncio.Future[SectionVerdict]]]:
    """A planner (50 ms window) on a test clock, moderation and pii asked about "hello" (of 3)."""
    clock, judge = LoopClock(monkeypatch), Judge()
    planner = _planner(judge, metrics, window=0.05)
    asked = [asyncio.ensure_future(planner.judge(_request(g, agent=agent))) for g in ("moderation", "pii")]
    return clock, judge, planner, asked


async def test_a_question_known_to_come_is_waited_for_past_the_window(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, judge, planner, early = _two_asked(metrics, monkeypatch, "three")
    for _ in range(6):  # 300 ms, six windows: injection (sure) has not asked yet
        await clock.advance(0.05)
    assert (judge.merged, judge.alone) == ([], [])
    await asyncio.gather(*early, planner.judge(_request("injection")))
    assert judge.merged == [["moderation", "pii", "injection"]]


async def test_a_question_not_known_to_come_is_not_waited_for(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, judge, _, early = _two_asked(metrics, monkeypatch, "unsure")
    await clock.advance(0.05)  # the lane quiet for its window: injection may settle it without the judge
    await asyncio.gather(*early)
    assert judge.merged == [["moderation", "pii"]]


async def test_a_window_the_loop_was_away_for_is_waited_again(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, judge, planner, early = _two_asked(metrics, monkeypatch, "unsure")
    await clock.advance(0.3)  # the timer fires 250 ms late: what came meanwhile is not read yet
    assert judge.merged == []
    await asyncio.gather(*early, planner.judge(_request("injection", agent="unsure")))
    assert judge.merged == [["moderation", "pii", "injection"]]


@pytest.mark.parametrize("at_once", [False, True])
async def test_a_guard_the_cache_answered_is_not_waited_for(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    _, judge, planner, early = _two_asked(metrics, monkeypatch, "three")  # no time passes
    await _settle()
    hit = mpb.ModelServiceGenerateRequest(model="judge", run_id="r1", processor_id="injection")
    hit.section.CopyFrom(mpb.JudgeSection(content="hello", instructions="i", question="q", phase="input"))
    if at_once:  # the gateway's fast path: sending and answered in one step
        planner.cached(hit, None, {"temperature": 0})
    else:
        planner.sending(hit, None, {"temperature": 0})
        planner.answered(hit, None, {"temperature": 0})  # the group goes out as the cache answers injection
    await asyncio.gather(*early)
    assert judge.merged == [["moderation", "pii"]]


async def test_a_guard_whose_question_failed_in_the_lane_is_not_waited_for_again(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # failed open, a stream guard judges no more of its step: its next question will not come
    judge = Judge({"injection": "not an object"})
    planner = _planner(judge, metrics, window=0.05)
    first = [planner.judge(_request(g, content="m1")) for g in ("moderation", "pii", "injection")]
    await asyncio.gather(*first, return_exceptions=True)
    clock = LoopClock(monkeypatch)
    second = [asyncio.ensure_future(planner.judge(_request(g, content="m2"))) for g in ("moderation", "pii")]
    await clock.advance(0.05)  # the lane quiet for its window: injection's question is not awaited
    assert judge.merged[-1] == ["moderation", "pii"]
    await asyncio.gather(*second)


async def test_sure_guards_are_awaited_only_once_one_of_them_asked(
    metrics: OrchestratorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a processor of one's own asks beside the built-ins; their sidecar may be down: none asked
    config = Config.model_validate(
        {
            "sidecars": {"g": {"address": "unix:///run/procmesh/guards.sock"}},
            "agents": {
                "mixed": {
                    "model": "demo",
                    "inputProcessors": [
                        _guard("moderation"),
                        {"processor": "g/policy", "options": {"model": "judge"}},
                    ],
                }
            },
        }
    )
    clock, judge = LoopClock(monkeypatch), Judge()
    planner = JudgePlanner(lambda: config, judge.once, judge.alone_call, metrics, lambda m: m, window=0.05)
    asked = asyncio.ensure_future(planner.judge(_request("policy", agent="mixed")))
    await clock.advance(0.05)  # the lane quiet for its window: moderation's question is not awaited
    assert judge.alone == ["policy"]
    await asyncio.gather(asked)
