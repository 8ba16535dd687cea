"""Every memory method of the real `@mastra/client-js` 1.47 against a real procmesh-orchestrator
(tests/clientjs/memory_api.mjs), with working memory kept by a scripted model behind a fake
OpenAI server that records each prompt: an update made in one thread is in the next thread's
prompt; each method works in the reference's shapes or answers 501 naming the feature, none 404.
(searchMemory with semantic recall: tests/e2e/memory of the recall work; here its text search.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from procmesh_orchestrator.run.framework.working_memory import TOOL_NAME
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = pytest.mark.e2e

TEMPLATE = "# User Information\n- **First Name**:"
ADA = "# User Information\n- **First Name**: Ada"

WORKS = {
    "getMemoryStatus",
    "getMemoryConfig",
    "createMemoryThread",
    "listMemoryThreads",
    "getWorkingMemory",
    "updateWorkingMemory",
    "searchMemory",
    "saveMessageToMemory",
    "listThreadMessages",
    "getMemoryThread(id).get",
    "getMemoryThread(id).update",
    "getMemoryThread(id).listMessages",
    "getMemoryThread(id).clone",
    "getMemoryThread(id).deleteMessages",
    "getMemoryThread(id).delete",
    "deleteThread(agentId)",
}
NOT_SUPPORTED = {
    "getMemoryThread(id).transfer": "thread transfer",
    "getObservationalMemory": "observational memory",
    "awaitBufferStatus": "observational memory",
    "listThreadMessages(networkId)": "agent networks",
    "deleteThread(networkId)": "agent networks",
}


@pytest.fixture(scope="module")
def model() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.start()
    fake.script(
        "keeper",
        {"toolCalls": [{"id": "wm1", "name": TOOL_NAME, "args": {"memory": ADA}}]},
        {"text": "Noted."},
        {"text": "You are Ada."},
        {"text": "Still Ada."},
    )
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def seen(
    model: FakeOpenAI,
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(tmp_path_factory.mktemp("memory"))},
        "providers": {"fake": {"kind": "openai", "baseUrl": model.base_url}},
        "agents": {
            "keeper": {
                "model": "fake/keeper",
                "errorProcessorDefaults": False,
                "memory": {"lastMessages": 10, "workingMemory": {"template": TEMPLATE}},
            }
        },
    }
    orchestrator = start_orchestrator(config, env={"PROCMESH_API_KEYS": "key-ada=user-ada"})
    output: dict[str, Any] = run_clientjs("memory_api.mjs", orchestrator, "key-ada", "user-ada")
    return output


def _system(request_body: dict[str, Any]) -> str:
    return "\n".join(str(m["content"]) for m in request_body["messages"] if m["role"] == "system")


def test_an_update_in_one_thread_is_in_the_next_threads_prompt(
    seen: dict[str, Any], model: FakeOpenAI
) -> None:
    probes = seen["probes"]
    assert probes["firstThread"] == {"ok": "Noted."}
    assert probes["secondThread"] == {"ok": "You are Ada."}
    first, _, second, read_only = (r.body for r in model.calls("keeper"))
    assert "<working_memory_data>\nnull\n</working_memory_data>" in _system(first)
    assert f"<working_memory_template>\n{TEMPLATE}\n</working_memory_template>" in _system(first)
    assert [t["function"]["name"] for t in first["tools"]] == [TOOL_NAME]
    # thread t2, the same resource: the update made in t1 is in its prompt
    assert f"<working_memory_data>\n{ADA}\n</working_memory_data>" in _system(second)
    # a read-only call gets the read-only instruction and no tool; lastMessages 1 keeps one message
    assert probes["readOnly"] == {"ok": "Still Ada."}
    assert "WORKING_MEMORY_SYSTEM_INSTRUCTION (READ-ONLY)" in _system(read_only)
    assert "tools" not in read_only or not read_only["tools"]
    history = json.dumps([m for m in read_only["messages"] if m["role"] != "system"])
    assert "You are Ada." in history
    assert "Who am I?" not in history  # the window held only the last stored message
    assert probes["badOption"]["status"] == 400
    assert "workingMemory" in str(probes["badOption"]["body"])


def test_every_memory_method_works_or_answers_501_by_name(seen: dict[str, Any]) -> None:
    methods = seen["methods"]
    assert set(methods) == WORKS | set(NOT_SUPPORTED)
    for name in WORKS:
        assert "ok" in methods[name], (name, methods[name])
    for name, feature in NOT_SUPPORTED.items():
        assert methods[name]["status"] == 501, (name, methods[name])
        assert f"{feature} is not supported by procmesh" in str(methods[name]["body"]), name
    print(f"\nclient-js memory methods: {len(WORKS)} work, {len(NOT_SUPPORTED)} answer 501, 0 answer 404")


def test_the_working_memory_routes_answer_in_the_references_shapes(seen: dict[str, Any]) -> None:
    methods, probes = seen["methods"], seen["probes"]
    assert methods["getWorkingMemory"]["ok"] == {
        "workingMemory": ADA,
        "source": "resource",
        "workingMemoryTemplate": {"format": "markdown", "content": TEMPLATE},
        "threadExists": True,
    }
    assert methods["updateWorkingMemory"]["ok"] == {"success": True}
    # resource-scoped: the update through thread t1 is what thread t3 reads
    assert probes["afterUpdate"]["ok"]["workingMemory"].endswith("- **Pet**: Rex")
    assert probes["updateUnknownThread"]["status"] == 404
    config = methods["getMemoryConfig"]["ok"]["config"]
    assert config["workingMemory"] == {"enabled": True, "scope": "resource", "template": TEMPLATE}


def test_search_without_semantic_recall_is_the_references_text_search(seen: dict[str, Any]) -> None:
    found = seen["methods"]["searchMemory"]["ok"]
    assert (found["query"], found["searchScope"], found["searchType"], found["count"]) == (
        "Ada",
        "thread",
        "text",
        1,
    )
    (result,) = found["results"]
    assert (result["role"], result["content"], result["threadId"]) == ("user", "My name is Ada.", "t1")
    assert [m["role"] for m in result["context"]["after"]] == ["assistant"]


def test_clone_and_delete_messages_follow_the_reference(seen: dict[str, Any]) -> None:
    methods, probes = seen["methods"], seen["probes"]
    clone = methods["getMemoryThread(id).clone"]["ok"]
    assert clone["thread"]["id"] == "t3-copy"
    assert clone["thread"]["title"] == "Clone of Third, renamed"
    assert clone["thread"]["metadata"]["clone"]["sourceThreadId"] == "t3"
    assert clone["thread"]["metadata"]["clone"]["lastMessageId"] == "m-c"
    assert len(clone["clonedMessages"]) == 2  # messageLimit: the last two
    assert set(clone["messageIdMap"]) == {"m-b", "m-c"}
    assert methods["getMemoryThread(id).deleteMessages"]["ok"] == {
        "success": True,
        "message": "2 messages deleted successfully",
    }
    assert probes["afterDelete"]["ok"] == ["m-c"]
    assert len(probes["cloneKept"]["ok"]) == 2  # the clone's copies are its own
