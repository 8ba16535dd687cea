"""Where a replay's runs come from: each run's decision record and recorded inputs, read from the
store (``decisions.record`` and ``agents.ID.recordInputs`` wrote them, `store.decisions`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.store import MAX_PAGE
from procmesh_orchestrator.store.decisions import Decision, DecisionStore

T = TypeVar("T")


class ReplayError(OrchestratorError):
    """A replay cannot start as asked (an unknown run, a run without recorded inputs, a bad
    candidate); the message names what."""


@dataclass
class RecordedRun:
    """What one run was given and what its processors decided, as recorded."""

    run_id: str
    agent_id: str
    decisions: list[Decision]
    input: Any = None
    request_context: dict[str, Any] = field(default_factory=dict)
    resource_id: str = ""
    thread_id: str = ""
    """The memory thread it ran on ("" for none)."""
    prompts: list[tuple[int, str]] = field(default_factory=list)
    """Each model call's step and prompt hash (`ModelRequest.digest`), in call order."""
    outputs: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    """Each model call's step and raw chunks, in call order."""
    tool_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each tool call's recorded answer by id (``toolCallId``, ``toolName``, ``args``, then
    ``result`` and ``modelOutput`` or ``error``): the tool's own (``tool-output``), else, in a
    recording that has none, the result as processToolResult left it."""
    memory: dict[str, Any] | None = None
    """What memory made of its prompt (``memory-context``), when its agent had memory and recorded
    it: the replay gives the candidate exactly this (`replay.memory`)."""
    truncated: bool = False
    """The recording stopped at ``decisions.maxInputBytes``: what is missing was not kept."""

    @property
    def replayable(self) -> bool:
        """Whether its inputs were recorded (``agents.ID.recordInputs`` was on for it)."""
        return self.input is not None


async def load_run(store: DecisionStore, run_id: str) -> RecordedRun:
    """The run's record; ReplayError when the store keeps nothing of it."""
    decisions = await store.run_decisions(run_id)
    inputs = await store.run_inputs(run_id)
    if not decisions and not inputs:
        raise ReplayError(f"run {run_id!r}: the store keeps no record of it (unknown run, or purged)")
    first = inputs[0] if inputs else decisions[0]
    run = RecordedRun(
        run_id, first.agent_id, decisions, resource_id=first.resource_id, thread_id=first.thread_id
    )
    for item in inputs:
        body = json.loads(item.body)
        if item.kind == "input":
            run.input = body
        elif item.kind == "request-context":
            run.request_context = dict(body or {})
        elif item.kind == "model-prompt":
            run.prompts.append((item.step, str(body.get("sha256", ""))))
        elif item.kind == "model-output":
            run.outputs.append((item.step, list(body)))
        elif item.kind == "tool-output":
            run.tool_results[str(body.get("toolCallId"))] = body
        elif item.kind == "tool-results":
            for result in body:  # the tool's own answer, when recorded, is the one to give
                run.tool_results.setdefault(str(result.get("toolCallId")), result)
        elif item.kind == "memory-context":
            run.memory = body
        elif item.kind == "truncated":
            run.truncated = True
    return run


async def runs_between(store: DecisionStore, since: str, until: str, agent_id: str) -> list[str]:
    """The agent's runs from `since` to before `until`: those with recorded inputs (oldest first),
    then those with only a decision record (listed as not replayable, not skipped). Both are read
    `MAX_PAGE` at a time (the most the store gives at once) until the range has given them all: a
    busy range is replayed whole, never cut at the first page without a word."""
    recorded = await _every(
        lambda at: store.recorded_runs(since, until, agent_id=agent_id, limit=MAX_PAGE, offset=at)
    )
    decided = await _every(
        lambda at: store.decisions_between(since, until, agent_id=agent_id, limit=MAX_PAGE, offset=at)
    )
    return list(dict.fromkeys([*recorded, *(d.run_id for d in decided)]))


async def _every(read: Callable[[int], Awaitable[list[T]]]) -> list[T]:
    """All that `read(offset)` gives, read `MAX_PAGE` at a time from offset 0 until a page comes
    back short: the whole range, however busy."""
    out: list[T] = []
    while True:
        page = await read(len(out))
        out += page
        if len(page) < MAX_PAGE:
            return out
