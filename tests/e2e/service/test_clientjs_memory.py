"""The real `@mastra/client-js` holds a conversation with memory, on both stores.

tests/clientjs/memory.mjs creates a thread, makes two ``generate`` calls on it (the second one's
answer can only come from the first turn, loaded from the thread), lists, updates, saves and
deletes through the memory API, and tries the thread with another resource's key. The orchestrator
is a real ``procmesh-orchestrator`` process, its keys bound to resources in ``PROCMESH_API_KEYS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.integration.memory.conftest import postgres_dsn  # noqa: F401
from tests.integration.memory.pg import fresh_dsn
from tests.integration.service.support import demo_answer

pytestmark = pytest.mark.e2e

KEYS = "key-ada=user-ada,key-bob=user-bob"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def conversation(
    request: pytest.FixtureRequest,
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    if request.param == "sqlite":
        storage = {"backend": "sqlite", "dataDir": str(tmp_path_factory.mktemp("memory"))}
    else:
        storage = {"backend": "postgres", "dsn": fresh_dsn(request.getfixturevalue("postgres_dsn"))}
    config = {
        "storage": storage,
        "models": {"demo": {"provider": "demo"}},
        "agents": {
            "assistant": {"model": "demo", "errorProcessorDefaults": False, "memory": {"lastMessages": 10}}
        },
    }
    orchestrator = start_orchestrator(config, env={"PROCMESH_API_KEYS": KEYS})
    output: dict[str, Any] = run_clientjs("memory.mjs", orchestrator, "key-ada", "user-ada", "key-bob")
    return output


def _text(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["content"]["parts"] if p["type"] == "text")


def test_the_second_generate_remembers_the_first_turn(conversation: dict[str, Any]) -> None:
    assert conversation["status"]["result"] is True
    assert conversation["first"] == demo_answer("My name is Ada.")
    # only the first turn, loaded from the thread, puts "My name is Ada." in the second prompt
    assert conversation["second"] == demo_answer("My name is Ada.")
    assert conversation["fresh"] == demo_answer("")


def test_the_thread_holds_the_conversation_in_order(conversation: dict[str, Any]) -> None:
    thread_id = conversation["created"]["id"]
    assert conversation["created"]["resourceId"] == "user-ada"
    assert conversation["got"]["title"] == "Chat with Ada"
    assert conversation["got"]["metadata"] == {"channel": "e2e"}
    assert conversation["updated"]["title"] == "Ada, renamed"
    messages = conversation["messages"]
    assert [(m["role"], _text(m)) for m in messages] == [
        ("user", "My name is Ada."),
        ("assistant", demo_answer("My name is Ada.")),
        ("assistant", demo_answer("My name is Ada.")),
    ]
    assert {m["threadId"] for m in messages} == {thread_id}
    assert conversation["saved"]["messages"][0]["id"] == "m-by-hand"
    assert conversation["afterSave"] == [*(m["id"] for m in messages), "m-by-hand"]
    listed = conversation["listed"]
    assert sorted(t["id"] for t in listed["threads"]) == sorted([thread_id, f"{thread_id}-fresh"])
    assert listed["total"] == 2


def test_another_resource_gets_404_and_sees_no_threads(conversation: dict[str, Any]) -> None:
    stranger = conversation["stranger"]
    for attempt in ("get", "messages", "update", "delete"):
        assert stranger[attempt]["status"] == 404, attempt
    assert stranger["listed"] == []


def test_a_deleted_thread_is_gone(conversation: dict[str, Any]) -> None:
    assert conversation["deleted"] == {"result": "Thread deleted"}
    assert conversation["afterDelete"]["status"] == 404
