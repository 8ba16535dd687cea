"""Memory's token budget on history (issue 29 item 3: the reference's ``memory.messageHistory``)
through the orchestrator (`App`, its config, a scripted model) on a real SQLite store.

The expected prompts and boundaries are what @mastra/memory 1.31 / @mastra/core 1.71 produce for
the same conversation (an Agent with ``Memory({messageHistory: {maxTokens: 100}})`` on an
in-memory store and a mock model, run with node in the conformance oracle's folder): the third
call's prompt starts at the second answer (the prompt is 113.8 estimated tokens, over 100: the
first three messages, 49 of them, go, leaving 64.8, under 75; the leading answer gets the "."
user turn providers need), and the thread
keeps the boundary ``{createdAt, messageIds: [the second question], maxTokens: 100,
atMaxRemoveTokens: 25}``, so the fourth call loads nothing older.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run import CallOptions, snapshot
from procmesh_orchestrator.run.framework.history_budget import (
    HistoryBudget,
    count_message,
    count_system,
    millis,
)
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.memory.test_echoed_history import shown

QUESTIONS = [
    "Hello there, my name is Ada and I like long walks.",
    "What did I say about myself?",
    "What is the capital of France?",
    "What is two plus two?",
]
ANSWERS = [
    "Nice to meet you, Ada. How can I help today?",
    "You said your name is Ada and you like long walks.",
    "The capital of France is Paris, a city on the Seine.",
    "Two plus two equals four.",
]
ON_T1 = CallOptions(thread_id="t1", resource_id="ada")


def _config(db: Path, memory: dict[str, Any]) -> dict[str, Any]:
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "models": {"m": {"provider": "scripted", "responses": [{"text": a} for a in ANSWERS]}},
        "agents": {
            "a": {
                "instructions": "You are helpful.",
                "model": "m",
                "errorProcessorDefaults": False,
                "memory": memory,
            }
        },
    }


@pytest_asyncio.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    async with App(
        parse_config(_config(tmp_path / "memory.db", {"messageHistory": {"maxTokens": 100}}))
    ) as started:
        yield started


def prompt(app: App, call: int) -> list[tuple[str, str]]:
    return shown(app.models["m"].requests[call])  # type: ignore[attr-defined]


async def test_history_is_trimmed_oldest_first_to_the_budget_as_the_reference_does(app: App) -> None:
    agent = app.agent("a")
    for question in QUESTIONS:
        await agent.generate(question, ON_T1)
    system = ("system", "You are helpful.")
    assert prompt(app, 1) == [
        system,
        ("user", QUESTIONS[0]),
        ("assistant", ANSWERS[0]),
        ("user", QUESTIONS[1]),
    ]
    # 24 + 9.8 (system) + 18 + 19 + 12 + 18 (history) + 13 (this question) = 113.8 > 100: the
    # oldest go until at most 75 (100 - 25): question 1, answer 1, question 2 (64.8 left)
    assert prompt(app, 2) == [system, ("user", "."), ("assistant", ANSWERS[1]), ("user", QUESTIONS[2])]
    # after the boundary: under 100, nothing trimmed (and nothing before the boundary read again)
    assert prompt(app, 3) == [
        system,
        ("user", "."),
        ("assistant", ANSWERS[1]),
        ("user", QUESTIONS[2]),
        ("assistant", ANSWERS[2]),
        ("user", QUESTIONS[3]),
    ]
    store = app.store
    assert store is not None
    stored = await store.messages("t1", "ada")
    assert [message_text(m) for m in stored] == [t for qa in zip(QUESTIONS, ANSWERS, strict=True) for t in qa]
    thread = await store.get_thread("t1", "ada")
    assert thread is not None
    boundary = thread.metadata["memoryTokenLimiter"]
    # the newest message trimmed (question 2), and any trimmed in its very millisecond
    assert boundary["messageIds"] == [m["id"] for m in stored[:3] if millis(m) == millis(stored[2])]
    assert stored[2]["id"] in boundary["messageIds"]
    assert (boundary["maxTokens"], boundary["atMaxRemoveTokens"]) == (100, 25)
    assert isinstance(boundary["maxTokens"], int)  # as the reference writes it: 100, not 100.0
    assert boundary["createdAt"][:23] == stored[2]["createdAt"][:23]


def test_the_counts_are_the_reference_memorys() -> None:
    """countMessage / the limiter's system count, pinned from the reference's TokenCounter."""

    def said(role: str, text: str) -> dict[str, Any]:
        return {"id": "x", "role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}

    assert [count_message(said("user", q)) for q in QUESTIONS] == PINNED_QUESTIONS
    assert [count_message(said("assistant", a)) for a in ANSWERS] == PINNED_ANSWERS
    assert count_system("You are helpful.") == pytest.approx(9.8)
    result = {
        "state": "result",
        "toolCallId": "c1",
        "toolName": "weather",
        "args": {"city": "Paris", "days": 2.0},
    }
    result["result"] = {"temp": 21.5, "sky": "clear skies over the Seine"}
    parts = [{"type": "tool-invocation", "toolInvocation": result}, {"type": "reasoning", "reasoning": ""}]
    parts += [{"type": "step-start"}, {"type": "text", "text": "It is sunny."}]
    call = {"state": "call", "toolCallId": "c2", "toolName": "lookup", "args": "raw string args"}
    assert count_message({"role": "assistant", "content": {"format": 2, "parts": parts}}) == 24
    assert (
        count_message(
            {"role": "assistant", "content": {"parts": [{"type": "tool-invocation", "toolInvocation": call}]}}
        )
        == 10
    )


PINNED_QUESTIONS = [18, 12, 13, 11]
PINNED_ANSWERS = [19, 18, 20, 12]


async def test_a_call_may_bring_its_own_budget_and_read_only_saves_no_boundary(tmp_path: Path) -> None:
    async with App(parse_config(_config(tmp_path / "memory.db", {"lastMessages": 10}))) as app:
        agent = app.agent("a")
        await agent.generate(QUESTIONS[0], ON_T1)
        await agent.generate(QUESTIONS[1], ON_T1)
        budget = MemoryCallOptions(message_history=HistoryBudget.of(100), read_only=True)
        await agent.generate(QUESTIONS[2], CallOptions(thread_id="t1", resource_id="ada", memory=budget))
        assert prompt(app, 2)[1:] == [("user", "."), ("assistant", ANSWERS[1]), ("user", QUESTIONS[2])]
        store = app.store
        assert store is not None
        thread = await store.get_thread("t1", "ada")
        assert thread is not None
        assert "memoryTokenLimiter" not in thread.metadata
        assert len(await store.messages("t1", "ada")) == 4  # read-only: this turn is not saved


FACT = "Paris is the capital and largest city of France, on the river Seine."


async def test_a_tool_loop_step_trims_again_as_the_reference_does(tmp_path: Path) -> None:
    """The reference checks the budget before every step: the second call's first step fits, but
    its tool result pushes the next step over 100, and both loaded messages go (node: the same)."""
    config = _config(tmp_path / "memory.db", {"messageHistory": {"maxTokens": 100}})
    lookup = {"toolCalls": [{"name": "lookup", "args": {"q": "France"}}]}
    config["models"]["m"]["responses"] = [
        {"text": ANSWERS[0]},
        lookup,
        {"text": "The capital of France is Paris."},
    ]
    config["tools"] = {"lookup": {"description": "lookup", "inputSchema": {"type": "object"}, "result": FACT}}
    config["agents"]["a"]["tools"] = ["lookup"]
    async with App(parse_config(config)) as app:
        agent = app.agent("a")
        await agent.generate(QUESTIONS[0], ON_T1)
        await agent.generate(QUESTIONS[2], ON_T1)
        first, second = prompt(app, 1), prompt(app, 2)
        assert first[1:] == [("user", QUESTIONS[0]), ("assistant", ANSWERS[0]), ("user", QUESTIONS[2])]
        assert [role for role, _ in second] == ["system", "user", "assistant", "tool"]
        assert second[1] == ("user", QUESTIONS[2])
        store = app.store
        assert store is not None
        stored = await store.messages("t1", "ada")
        thread = await store.get_thread("t1", "ada")
        assert thread is not None
        # the boundary: the newest removed message (the first answer) and any removed in its very
        # millisecond (the first question too, when both were stored within one)
        newest = millis(stored[1])
        at_boundary = [m["id"] for m in stored[:2] if millis(m) == newest]
        assert thread.metadata["memoryTokenLimiter"]["messageIds"] == at_boundary
        assert stored[1]["id"] in at_boundary
        assert [message_text(m) for m in stored[:3]] == [QUESTIONS[0], ANSWERS[0], QUESTIONS[2]]  # untouched


async def test_over_http_the_body_s_memory_options_carry_a_budget_and_the_config_route_shows_it(
    tmp_path: Path,
) -> None:
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    config = _config(tmp_path / "memory.db", {"messageHistory": {"maxTokens": 4000}})
    async with Service(settings, parse_config(config)) as service:
        base = f"http://127.0.0.1:{service.http_port}"
        async with httpx.AsyncClient(base_url=base, timeout=20) as http:
            shown_config = (await http.get("/api/memory/config?agentId=a")).json()["config"]
            assert shown_config["messageHistory"] == {"maxTokens": 4000, "atMaxRemoveTokens": 1000}
            assert '"maxTokens":4000,' in (await http.get("/api/memory/config?agentId=a")).text
            assert "lastMessages" not in shown_config  # the budget replaces the window
            memory = {"thread": "t1", "resource": "ada"}
            for question in QUESTIONS[:2]:
                answer = await http.post(
                    "/api/agents/a/generate", json={"messages": question, "memory": memory}
                )
                assert answer.status_code == 200, answer.text
            memory["options"] = {"messageHistory": {"maxTokens": 100}}
            answer = await http.post(
                "/api/agents/a/generate", json={"messages": QUESTIONS[2], "memory": memory}
            )
            assert answer.status_code == 200, answer.text
            assert prompt(service.app, 2)[1:] == [
                ("user", "."),
                ("assistant", ANSWERS[1]),
                ("user", QUESTIONS[2]),
            ]
            memory["options"] = {"messageHistory": {"maxTokens": 100, "atMaxRemoveTokens": 200}}
            refused = await http.post("/api/agents/a/generate", json={"messages": "hi", "memory": memory})
            assert refused.status_code == 400
            assert "atMaxRemoveTokens" in refused.text


async def test_over_grpc_memory_options_carry_a_budget(tmp_path: Path) -> None:
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    config = parse_config(_config(tmp_path / "memory.db", {}))
    async with (
        Service(settings, config) as service,
        grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
    ):
        stub = agrpc.AgentServiceStub(channel)

        def ask(text: str, **budget: float) -> apb.GenerateRequest:
            request = apb.GenerateRequest(agent_id="a", text=text, thread_id="t1", resource_id="ada")
            if budget:
                request.memory_options.message_history.CopyFrom(apb.MessageHistory(**budget))
            return request

        for question in QUESTIONS[:2]:
            await stub.Generate(ask(question), timeout=20)
        await stub.Generate(ask(QUESTIONS[2], max_tokens=100), timeout=20)
        assert prompt(service.app, 2)[1:] == [
            ("user", "."),
            ("assistant", ANSWERS[1]),
            ("user", QUESTIONS[2]),
        ]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Generate(ask("hi", max_tokens=100, at_max_remove_tokens=200), timeout=20)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "atMaxRemoveTokens" in str(refused.value.details())


def test_a_suspended_call_keeps_its_budget_for_the_steps_after_resuming() -> None:
    options = CallOptions(memory=MemoryCallOptions(message_history=HistoryBudget.of(100, 10)))
    kept = snapshot._step_options(options)["memoryOptions"]
    assert snapshot._memory_options(kept).message_history == HistoryBudget(100, 10)
    assert snapshot._memory_options({"lastMessages": 3}).message_history is None  # a snapshot from before


@pytest.mark.parametrize(
    ("history", "key"),
    [
        ({"maxTokens": -1}, "maxTokens"),
        ({"maxTokens": 100, "atMaxRemoveTokens": 101}, "atMaxRemoveTokens"),
        ({"maxTokens": 100, "removeTokens": 5}, "removeTokens"),
    ],
)
def test_a_bad_budget_is_refused_at_config_load_naming_the_key(
    tmp_path: Path, history: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(_config(tmp_path / "m.db", {"messageHistory": history}))
    assert "messageHistory" in str(refused.value)
    assert key in str(refused.value)
