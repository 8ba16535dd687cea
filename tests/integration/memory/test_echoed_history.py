"""Echoed client history (SEED-GAPS O7) on a real SQLite store: a client resending the
conversation under ids of its own neither shows the model a message twice nor stores it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run.fakes import FakeModel, agent

T1 = CallOptions(thread_id="t1", resource_id="ada")


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    opened = SqliteMemoryStore(tmp_path / "memory.db")
    await opened.start()
    yield opened
    await opened.close()


def said(role: str, text: str, msg_id: str) -> dict[str, Any]:
    return {"id": msg_id, "role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def shown(request: ModelRequest) -> list[tuple[str, str]]:
    return [
        (
            m["role"],
            m["content"]
            if isinstance(m["content"], str)
            else "".join(p.get("text", "") for p in m["content"]),
        )
        for m in request.prompt
    ]


async def test_a_resent_conversation_under_new_ids_is_read_and_stored_once(store: SqliteMemoryStore) -> None:
    model = FakeModel({"text": "Nice to meet you"}, {"text": "Ada"})
    bot = agent(model, [], memory=AgentMemory(store, 10, "sqlite:test"))  # type: ignore[arg-type]
    await bot.generate("I am Ada", T1)
    echoed = [
        said("user", "I am Ada", "client-1"),
        said("assistant", "Nice to meet you ", "client-2"),
        said("user", "Who am I?", "client-3"),
    ]
    await bot.generate(echoed, T1)
    assert shown(model.requests[1]) == [
        ("user", "I am Ada"),
        ("assistant", "Nice to meet you "),
        ("user", "Who am I?"),
    ]
    assert [message_text(m) for m in await store.messages("t1", "ada")] == [
        "I am Ada",
        "Nice to meet you ",
        "Who am I?",
        "Ada ",
    ]


async def test_what_is_not_an_echo_stays_and_the_last_message_always_does(store: SqliteMemoryStore) -> None:
    model = FakeModel({"text": "hello"}, {"text": "again"})
    bot = agent(model, [], memory=AgentMemory(store, 10, "sqlite:test"))  # type: ignore[arg-type]
    await bot.generate("hi", T1)
    # the client's own note was never stored: it stays; "hi" said again as the new turn stays too
    await bot.generate([said("user", "a note of the client", "c1"), said("user", "hi", "c2")], T1)
    assert shown(model.requests[1]) == [
        ("user", "hi"),
        ("assistant", "hello "),
        ("user", "a note of the client"),
        ("user", "hi"),
    ]
    assert len(await store.messages("t1", "ada")) == 5


async def test_an_echo_older_than_the_window_is_still_recognized(store: SqliteMemoryStore) -> None:
    model = FakeModel({"text": "one"}, {"text": "two"}, {"text": "three"})
    bot = agent(model, [], memory=AgentMemory(store, 2, "sqlite:test"))  # type: ignore[arg-type]
    await bot.generate("q1", T1)
    await bot.generate("q2", T1)
    history = [said("user", "q1", "x1"), said("assistant", "one ", "x2"), said("user", "q2", "x3")]
    await bot.generate([*history, said("assistant", "two ", "x4"), said("user", "q3", "x5")], T1)
    # the window holds q2 and its answer; q1 and its answer, echoed, are not read again
    assert shown(model.requests[2]) == [("user", "q2"), ("assistant", "two "), ("user", "q3")]
    assert len(await store.messages("t1", "ada")) == 6
