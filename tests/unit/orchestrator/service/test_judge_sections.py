"""The gateway's check that a request's schema is a JSON schema (service/grpc/judge_sections.py)."""

from __future__ import annotations

from procmesh_orchestrator.service.grpc.judge_sections import _schema_problem, schema_problem


def test_a_schema_is_checked_against_its_meta_schema_once_per_schema() -> None:
    verdict = {"type": "object", "properties": {"flag": {"type": "boolean"}, "score": {"maximum": 1.0}}}
    before = _schema_problem.cache_info()
    assert schema_problem(verdict) is None
    assert schema_problem(dict(reversed(verdict.items()))) is None  # the same schema, keys in another order
    after = _schema_problem.cache_info()
    assert after.misses - before.misses <= 1  # checked at most once (an earlier test may have)
    assert after.hits - before.hits >= 1
    assert schema_problem({"type": 5}) == "5 is not valid under any of the given schemas"
    assert schema_problem({"type": 5}) == "5 is not valid under any of the given schemas"  # kept: same answer
