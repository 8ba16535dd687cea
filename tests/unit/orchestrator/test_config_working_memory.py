"""``memory.workingMemory`` and ``memory.readOnly`` in the configuration: what is accepted, and each
refusal naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.app._pipeline import working_memory_settings
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run.framework.working_memory import WorkingMemorySettings


def memory(**options: Any) -> dict[str, Any]:
    return {"agents": {"a": {"model": "demo", "memory": options}}}


def test_the_reference_options_are_taken() -> None:
    config = parse_config(memory(workingMemory={"scope": "thread", "template": "# Notes"}, readOnly=True))
    agent_memory = config.agents["a"].memory
    assert agent_memory is not None
    assert agent_memory.read_only is True
    settings = working_memory_settings(agent_memory.working_memory)
    assert settings == WorkingMemorySettings(scope="thread", template="# Notes")
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    by_schema = parse_config(memory(workingMemory={"schema": schema})).agents["a"].memory
    assert by_schema is not None
    assert working_memory_settings(by_schema.working_memory) == WorkingMemorySettings(schema=schema)
    off = parse_config(memory(workingMemory={"enabled": False})).agents["a"].memory
    assert off is not None
    assert working_memory_settings(off.working_memory) is None


@pytest.mark.parametrize(
    ("working", "words"),
    [
        ({"template": "x", "schema": {"type": "object"}}, "a template or a schema, not both"),
        ({"schema": {"type": "array"}}, "must describe an object"),
        ({"schema": {"type": "object", "properties": 3}}, "not a valid JSON Schema"),
        ({"scope": "user"}, "scope"),
        ({"tempalte": "x"}, "tempalte"),
    ],
)
def test_a_wrong_option_is_refused_by_name(working: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match="workingMemory") as caught:
        parse_config(memory(workingMemory=working))
    assert words in str(caught.value)
