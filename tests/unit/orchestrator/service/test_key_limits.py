"""Requests in flight per API key (`KeyLimits`): a key at its limit is refused naming it, other keys
are not, a slot given back (once) frees it, and no keys (development) means no per-key limit."""

from __future__ import annotations

import pytest

from procmesh_orchestrator.service._auth import ANONYMOUS, Caller
from procmesh_orchestrator.service._errors import TooManyRequestsError
from procmesh_orchestrator.service._limits import KeyLimits
from procmesh_orchestrator.settings import OrchestratorSettings

A = Caller("key-1", "tenant-a", frozenset())
B = Caller("key-2", "tenant-b", frozenset())


def test_a_key_at_its_limit_is_refused_while_another_key_is_served() -> None:
    limits = KeyLimits(2)
    held = [limits.take(A), limits.take(A)]
    with pytest.raises(TooManyRequestsError) as info:
        limits.take(A)
    assert str(info.value) == (
        "API key key-1 has 2 requests in flight, its limit (PROCMESH_MAX_INFLIGHT_PER_KEY=2): "
        "retry when one has ended"
    )
    assert info.value.http_status == 429
    assert info.value.grpc_code.name == "RESOURCE_EXHAUSTED"
    limits.take(B)()
    held[0]()
    held[0]()  # given back once, however often it is called
    assert limits.inflight("key-1") == 1
    limits.take(A)
    held[1]()
    assert limits.inflight("key-1") == 1


def test_the_context_manager_gives_the_slot_back_on_errors_too() -> None:
    limits = KeyLimits(1)
    with pytest.raises(RuntimeError), limits.slot(A):
        raise RuntimeError("boom")
    assert limits.inflight("key-1") == 0


def test_no_keys_configured_means_no_limit_per_key() -> None:
    limits = KeyLimits(1)
    for _ in range(5):
        limits.take(ANONYMOUS)
    assert limits.inflight(ANONYMOUS.key_id) == 0


def test_the_default_is_a_quarter_of_max_connections() -> None:
    assert OrchestratorSettings().inflight_per_key == 128
    assert OrchestratorSettings(max_connections=2).inflight_per_key == 1
    assert OrchestratorSettings(max_inflight_per_key=7).inflight_per_key == 7
