"""An agent's requestContextSchema in the Python API: a context it refuses fails generate() and
stream() with RequestContextError naming the keys, before any processor or model is called."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.config.request_context import ContextSchema
from procmesh_orchestrator.errors import ConfigError, RequestContextError
from procmesh_orchestrator.run import CallOptions
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply

SCHEMA = {
    "properties": {"tenant": {"type": "string"}, "tokenLimit": {"type": "integer", "minimum": 1}},
    "patternProperties": {"^x-": {"type": "string"}},
    "required": ["tenant"],
}


def _guarded(log: list[Call], model: FakeModel) -> Any:
    seen = FakeProcessor("seen", {"process_input": lambda args, info: reply()})
    return agent(model, log, input=(seen,), request_context_schema=SCHEMA)


@pytest.mark.parametrize(
    ("context", "message", "keys"),
    [
        ({}, "requestContext: agent 'a' requires 'tenant' (requestContextSchema), missing", ["tenant"]),
        (
            {"tenant": "acme", "region": "eu", "debug": True},
            "requestContext: agent 'a' does not declare 'debug', 'region' in its requestContextSchema "
            "(declared: 'tenant', 'tokenLimit')",
            ["debug", "region"],
        ),
        ({"tenant": 7}, "requestContext.tenant: 7 is not of type 'string'", ["tenant"]),
        (
            {"tenant": "acme", "tokenLimit": 0},
            "requestContext.tokenLimit: 0 is less than the minimum of 1",
            ["tokenLimit"],
        ),
        ({"tenant": "acme", "x-trace": 1}, "requestContext.x-trace: 1 is not of type 'string'", ["x-trace"]),
    ],
)
async def test_a_refused_context_fails_before_any_hook(
    context: dict[str, Any], message: str, keys: list[str]
) -> None:
    log: list[Call] = []
    model = FakeModel({"text": "hi"})
    subject = _guarded(log, model)
    with pytest.raises(RequestContextError) as generate:
        await subject.generate("q", CallOptions(request_context=context))
    with pytest.raises(RequestContextError) as stream:
        subject.stream("q", CallOptions(request_context=context))
    for info in (generate, stream):
        assert str(info.value).startswith(message)
        assert info.value.keys == keys
        assert isinstance(info.value, ValueError)
    assert log == []
    assert model.requests == []


async def test_an_accepted_context_runs() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "hi"})
    subject = _guarded(log, model)
    context = {"tenant": "acme", "tokenLimit": 3, "x-trace": "t1"}
    result = await subject.generate("q", CallOptions(request_context=context))
    assert result.text == "hi "
    assert [c.processor for c in log] == ["seen"]
    subject.check_call(CallOptions(request_context=context))


def test_an_open_schema_takes_other_keys() -> None:
    schema = ContextSchema.of("a", {**SCHEMA, "additionalProperties": True})
    schema.check({"tenant": "acme", "anything": [1]})
    with pytest.raises(RequestContextError, match="requires 'tenant'"):
        schema.check({"anything": 1})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "array"}, "the request context is an object: type must be 'object', got 'array'"),
        ({"properties": {"n": {"type": "count"}}}, "not a valid JSON Schema"),
        ({"patternProperties": {"(": {}}}, "not a valid JSON Schema at patternProperties"),
    ],
)
def test_a_schema_that_is_not_one_is_refused(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ContextSchema.of("a", schema)
    config = {"agents": {"a": {"model": "demo", "requestContextSchema": schema}}}
    with pytest.raises(ConfigError, match="agents.a.requestContextSchema: Value error, " + message[:20]):
        parse_config(config)
