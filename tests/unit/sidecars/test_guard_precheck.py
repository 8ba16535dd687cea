"""A judged guard's ``precheck`` option (`guards._precheck`): what it settles, what it refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from procmesh_sidecars.builtins.guards._precheck import Precheck
from procmesh_sidecars.builtins.guards.moderation import ModerationOptions
from procmesh_sidecars.builtins.guards.pii import PIIOptions


def test_deny_finds_a_match_anywhere_and_allow_needs_the_whole_text() -> None:
    check = Precheck(deny=["secret", "(?i)forbidden"], allow=["(hi|hello)!?"])
    assert check.settle("a FORBIDDEN word") == ("deny", 1)
    assert check.settle("hello!") == ("allow", 0)
    assert check.settle("hello there") is None  # not the whole text
    assert check.settle("hello, secret") == ("deny", 0)  # deny first


def test_a_deny_pattern_needs_a_strategy_that_needs_nothing_from_the_judge() -> None:
    ModerationOptions(model="m", strategy="filter", precheck={"deny": ["x"]})
    PIIOptions(model="m", precheck={"allow": ["[0-9 ]+"]})  # redact, allow only: fine
    with pytest.raises(ValidationError, match="strategy 'redact' needs the judge's answer"):
        PIIOptions(model="m", precheck={"deny": ["x"]})


def test_bad_patterns_and_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="RE2"):
        Precheck(deny=["(?<=a)b"])
    with pytest.raises(ValidationError, match="denny"):
        Precheck.model_validate({"denny": ["x"]})
