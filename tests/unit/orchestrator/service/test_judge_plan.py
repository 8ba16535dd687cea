"""Which guards the judge plan counts as certain to ask about a text (service/grpc/judge_plan.py):
only built-in guards whose skip rules it models, and only about texts they are given; the rules
it models, pinned against the built-in guards' own code (sidecars/.../builtins/guards/)."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from procmesh_orchestrator.config import Config
from procmesh_orchestrator.service.grpc.judge_plan import BUILTIN_GUARDS, JudgePlan
from procmesh_orchestrator.service.grpc.judge_sections import SectionRequest
from procmesh_sidecars.builtins.guards import GUARDS
from procmesh_sidecars.builtins.guards._judge import InputHook, JudgedGuard, StreamHook

LONG = "What should a first-time visitor know?"


def _b(pid: str, entry: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """A built-in guard's lane entry (`entry`: its keys beside the options)."""
    return {"processor": f"builtins/{pid}", "options": {"model": "judge", **options}, **(entry or {})}


def _plan(phase: str, *lane: dict[str, Any]) -> JudgePlan:
    config = {
        "sidecars": {"g": {"address": "unix:///run/procmesh/g.sock"}},
        "agents": {"a": {"model": "demo", f"{phase}Processors": list(lane)}},
    }
    return JudgePlan.of(Config.model_validate(config))


def _sure(plan: JudgePlan, asker: str, phase: str = "input", content: str = LONG) -> set[str]:
    return {min(ids) for ids in plan.sure(_ask(asker, phase, content))}


def _ask(asker: str, phase: str = "input", content: str = LONG) -> SectionRequest:
    return SectionRequest(
        guard_id=asker,
        processor=asker,
        model="judge",
        run_id="r",
        resource=None,
        phase=phase,
        content=content,
        instructions="",
        question="",
        schema={},
        messages=(),
        settings={},
        agent="a",
    )


def test_only_built_in_guards_whose_skip_rules_are_modelled_are_sure() -> None:
    plan = _plan(
        "input",
        _b("moderation"),
        _b("pii-detector", {"mode": "monitor"}, strategy="warn"),  # records, enforces nothing
        _b("prompt-injection-detector", {"speculative": False}),
        _b("system-prompt-scrubber"),  # no input hook
        {"processor": "g/policy", "options": {"model": "judge"}},  # declares nothing
    )
    assert _sure(plan, "moderation") == {"moderation"}
    assert _sure(plan, "policy") == set()  # the entries between may run apart and change its text
    assert plan.count(_ask("moderation")) == 4  # the scrubber never asks about an input


def test_the_language_detector_is_sure_only_of_texts_as_long_as_its_minimum() -> None:
    lane = [_b("moderation"), _b("language-detector"), _b("pii-detector")]
    plan = _plan("input", *lane)
    assert _sure(plan, "moderation", content="Hello!") == {"moderation", "pii-detector"}
    assert _sure(plan, "moderation") == {"moderation", "language-detector", "pii-detector"}
    # and it is not counted among the questions a short text gets: its group goes once the rest are in
    assert (plan.count(_ask("moderation", content="Hello!")), plan.count(_ask("moderation"))) == (2, 3)
    plan = _plan("input", lane[0], _b("language-detector", min_text_length=3))
    assert _sure(plan, "moderation", content="Hello!") == {"moderation", "language-detector"}
    from_context = _b("language-detector", min_text_length={"fromContext": "min", "default": 3})
    assert _sure(_plan("input", lane[0], from_context), "moderation") == {"moderation"}


def test_a_text_changed_before_the_asker_is_not_one_the_guards_before_the_change_get() -> None:
    out = _plan("output", _b("moderation"), _b("system-prompt-scrubber"), _b("pii-detector"))
    everyone = {"moderation", "system-prompt-scrubber", "pii-detector"}
    assert _sure(out, "moderation", "output") == everyone  # the lane's own text: all get it at once
    assert _sure(out, "system-prompt-scrubber", "output") == everyone
    assert _sure(out, "pii-detector", "output") == {"pii-detector"}  # may be the scrubber's redaction
    # input: the entries after a change are called again together, on the changed text
    inp = _plan("input", _b("pii-detector"), _b("moderation"), _b("prompt-injection-detector"))
    assert _sure(inp, "moderation") == {"moderation", "prompt-injection-detector"}
    assert _sure(inp, "pii-detector") == {"pii-detector", "moderation", "prompt-injection-detector"}
    # output: behind the asker, a text changed before it comes only once the asker let it go
    out = _plan("output", _b("pii-detector"), _b("moderation"), _b("system-prompt-scrubber"))
    assert _sure(out, "moderation", "output") == {"moderation"}


def test_an_entry_that_may_run_apart_between_them_makes_the_later_guard_unsure() -> None:
    unknown = {"processor": "g/normalize"}  # no model: not asking, but the plan cannot know it
    plan = _plan("input", _b("moderation"), unknown, _b("pii-detector", strategy="warn"))
    assert _sure(plan, "moderation") == {"moderation"}
    assert _sure(plan, "pii-detector") == {"pii-detector"}  # the unknown one may change the text


@pytest.mark.parametrize("pid", sorted(GUARDS))
def test_the_modelled_rules_are_the_built_in_guards_own(pid: str) -> None:
    cls = GUARDS[pid]
    assert issubclass(cls, JudgedGuard)
    rules = BUILTIN_GUARDS[pid]
    phases = {p for p, hook in (("input", InputHook), ("output", StreamHook)) if issubclass(cls, hook)}
    assert rules.phases == phases
    options_type = cls.Options
    assert options_type is not None
    strategy = options_type.model_fields["strategy"]
    assert rules.strategy == strategy.default
    assert rules.changes <= set(get_args(strategy.annotation))
    options = options_type(model="judge")
    if rules.min_length is None:
        assert cls.min_length is JudgedGuard.min_length  # every text that is not empty
    else:
        assert getattr(options, rules.min_length) == rules.min_length_default
        assert cls().min_length(options) == rules.min_length_default
        shorter = options_type(model="judge", **{rules.min_length: 0})
        assert cls().min_length(shorter) == 1
    assert set(BUILTIN_GUARDS) == set(GUARDS)
