"""The memory HTTP API (/api/memory/*) on both real stores, as @mastra/client-js calls it.

Keys are bound to resources (``PROCMESH_API_KEYS`` entries ``key=resource``): a caller sees its own
resource's threads only. Thread ids are scoped by resource: another resource's thread id answers
exactly as an unknown one (same status, same body), and using it gives the caller its own thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.service._auth import split_binding
from procmesh_orchestrator.service.api import memory as api_memory
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.store import _threads
from procmesh_orchestrator.store.postgres import PostgresMemoryStore
from tests.integration.memory.conftest import Backend, backend, postgres_dsn  # noqa: F401
from tests.integration.memory.pg import PostgresServer
from tests.integration.service.support import demo_answer

pytestmark = pytest.mark.asyncio

ADA = {"Authorization": "Bearer key-ada"}
BOB = {"Authorization": "Bearer key-bob"}
UNBOUND = {"Authorization": "Bearer key-admin"}


def _config(db: Backend) -> dict[str, Any]:
    storage = (
        {"backend": "sqlite", "path": db.location}
        if db.name == "sqlite"
        else {"backend": "postgres", "dsn": db.location}
    )
    return {
        "storage": storage,
        "models": {"demo": {"provider": "demo"}},
        "agents": {
            "assistant": {"model": "demo", "errorProcessorDefaults": False, "memory": {"lastMessages": 10}},
            "plain": {"model": "demo", "errorProcessorDefaults": False},
        },
    }


@pytest_asyncio.fixture
async def service(backend: Backend) -> AsyncIterator[Service]:  # noqa: F811
    keys = [SecretStr(k) for k in ("key-admin=@operator", "key-ada=user-ada", "key-bob=user-bob")]
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=keys)
    async with Service(settings, parse_config(_config(backend))) as svc:
        yield svc


@pytest_asyncio.fixture
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as client:
        yield client


async def _create(http: httpx.AsyncClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = await http.post("/api/memory/threads?agentId=assistant", json=body, headers=headers)
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


async def test_a_thread_lives_through_create_get_update_generate_list_and_delete(
    http: httpx.AsyncClient,
) -> None:
    created = await _create(http, ADA, threadId="t-1", title="First", metadata={"topic": "names"})
    assert created["id"] == "t-1"
    assert created["resourceId"] == "user-ada"
    assert created["title"] == "First"
    assert created["createdAt"].endswith("Z")
    got = await http.get("/api/memory/threads/t-1?agentId=assistant", headers=ADA)
    assert got.json() == created
    patched = await http.patch(
        "/api/memory/threads/t-1?agentId=assistant", json={"title": "Renamed"}, headers=ADA
    )
    assert patched.json()["title"] == "Renamed"
    assert patched.json()["metadata"] == {"topic": "names"}
    for text in ("My name is Ada.", "What did I say?"):
        run = await http.post(
            "/api/agents/assistant/generate",
            json={"messages": text, "memory": {"thread": "t-1"}},
            headers=ADA,
        )
        assert run.json()["text"] == demo_answer(text)
    listed = await http.get("/api/memory/threads/t-1/messages?agentId=assistant", headers=ADA)
    body = listed.json()
    assert [(m["role"], message_text(m)) for m in body["messages"]] == [
        ("user", "My name is Ada."),
        ("assistant", demo_answer("My name is Ada.")),
        ("user", "What did I say?"),
        ("assistant", demo_answer("What did I say?")),
    ]
    assert body["total"] == 4
    assert body["hasMore"] is False
    assert len(body["uiMessages"]) == 4
    page = await http.get("/api/memory/threads/t-1/messages?perPage=3&page=1", headers=ADA)
    assert [message_text(m) for m in page.json()["messages"]] == [demo_answer("What did I say?")]
    assert page.json()["hasMore"] is False
    for per_page, more in ((3, True), (4, False)):  # a first page that ends at the last message: no more
        first = await http.get(f"/api/memory/threads/t-1/messages?perPage={per_page}", headers=ADA)
        assert first.json()["hasMore"] is more, per_page
    everything = (await http.get("/api/memory/threads/t-1/messages?perPage=false", headers=ADA)).json()
    assert (len(everything["messages"]), everything["perPage"], everything["hasMore"]) == (4, False, False)
    threads = (await http.get("/api/memory/threads?agentId=assistant", headers=ADA)).json()
    assert [t["id"] for t in threads["threads"]] == ["t-1"]
    assert (threads["total"], threads["hasMore"]) == (1, False)
    one = await http.get("/api/memory/threads?agentId=assistant&perPage=1", headers=ADA)  # ends at it
    assert one.json()["hasMore"] is False
    deleted = await http.delete("/api/memory/threads/t-1?agentId=assistant", headers=ADA)
    assert deleted.json() == {"result": "Thread deleted"}
    assert (await http.get("/api/memory/threads/t-1", headers=ADA)).status_code == 404


async def test_a_resource_with_more_threads_than_the_store_reads_at_once_lists_them_all(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store reads at most MAX_PAGE threads at once (10 000; 2 here, on both stores). A listing
    is ordered, paged and counted by the store, so ``total`` counts every thread and each page
    holds its own; a listing by metadata and the text search, which the store cannot filter,
    read on until they have every thread."""
    monkeypatch.setattr(_threads, "MAX_PAGE", 2)  # what the store gives at once
    monkeypatch.setattr(api_memory, "MAX_PAGE", 2)  # what the API asks it for when reading them all
    for i in range(5):
        await _create(http, ADA, threadId=f"many-{i}", title=f"Thread {i}", metadata={"kind": "many"})
    pages = [
        (await http.get(f"/api/memory/threads?agentId=assistant&perPage=2&page={n}", headers=ADA)).json()
        for n in range(3)
    ]
    assert [p["total"] for p in pages] == [5, 5, 5]
    assert [p["hasMore"] for p in pages] == [True, True, False]
    newest_first = [f"many-{i}" for i in (4, 3, 2, 1, 0)]
    assert [t["id"] for p in pages for t in p["threads"]] == newest_first
    by_kind = '&metadata={"kind":"many"}'
    listed = await http.get(f"/api/memory/threads?agentId=assistant&perPage=10{by_kind}", headers=ADA)
    assert listed.status_code == 200, listed.text
    assert [t["id"] for t in listed.json()["threads"]] == newest_first
    assert listed.json()["total"] == 5
    save = {"messages": [{"threadId": "many-0", "role": "user", "content": "the oldest one"}]}
    saved = await http.post("/api/memory/save-messages?agentId=assistant", json=save, headers=ADA)
    assert saved.status_code == 200, saved.text
    for i in (5, 6):  # many-0, updated by the save, is no longer among the two newest
        await _create(http, ADA, threadId=f"many-{i}")
    search = "/api/memory/search?agentId=assistant&searchQuery=oldest"
    found = (await http.get(search, headers=ADA)).json()
    assert [r["threadId"] for r in found["results"]] == ["many-0"]


async def test_a_listing_by_metadata_matches_json_values_by_type(http: httpx.AsyncClient) -> None:
    """A boolean is not a number (Python's ``True == 1``), ``1`` is ``1.0``, objects and arrays
    match member by member, and a key a thread lacks matches nothing, ``null`` included."""
    kinds = {
        "typed-true": {"flag": True, "n": 1, "tags": ["a", "b"], "owner": {"id": 7}},
        "typed-one": {"flag": 1, "n": 1.0, "tags": ["b", "a"], "owner": {"id": 7, "x": 0}},
        "typed-null": {"gone": None},
    }
    for thread_id, metadata in kinds.items():
        await _create(http, ADA, threadId=thread_id, metadata=metadata)

    async def matching(query: dict[str, Any]) -> list[str]:
        params = {"agentId": "assistant", "metadata": json.dumps(query)}
        listed = await http.get("/api/memory/threads", params=params, headers=ADA)
        assert listed.status_code == 200, listed.text
        return sorted(t["id"] for t in listed.json()["threads"] if t["id"].startswith("typed-"))

    assert await matching({"flag": True}) == ["typed-true"]
    assert await matching({"flag": 1}) == ["typed-one"]
    assert await matching({"n": 1}) == ["typed-one", "typed-true"]
    assert await matching({"tags": ["a", "b"]}) == ["typed-true"]
    assert await matching({"owner": {"id": 7}}) == ["typed-true"]
    assert await matching({"gone": None}) == ["typed-null"]
    assert await matching({"flag": None}) == []


async def test_threads_are_listed_in_the_order_asked_for(http: httpx.AsyncClient) -> None:
    """``orderBy`` by creation or last update, either way, over pages the store cuts."""
    for i in range(3):
        await _create(http, ADA, threadId=f"o-{i}")
    save = {"messages": [{"threadId": "o-0", "role": "user", "content": "an update"}]}
    assert (
        await http.post("/api/memory/save-messages?agentId=assistant", json=save, headers=ADA)
    ).status_code == 200

    async def listed(order: str) -> list[str]:
        ids = []
        for page in range(3):
            url = f"/api/memory/threads?agentId=assistant&perPage=1&page={page}&{order}"
            ids += [t["id"] for t in (await http.get(url, headers=ADA)).json()["threads"]]
        return ids

    assert await listed("") == ["o-2", "o-1", "o-0"]  # the default: newest created first
    assert await listed("orderBy[field]=createdAt&orderBy[direction]=ASC") == ["o-0", "o-1", "o-2"]
    assert await listed("orderBy[field]=updatedAt&orderBy[direction]=DESC") == ["o-0", "o-2", "o-1"]
    assert await listed("orderBy[field]=updatedAt&orderBy[direction]=ASC") == ["o-1", "o-2", "o-0"]


async def _bobs_answers(http: httpx.AsyncClient, thread: str) -> list[tuple[int, Any]]:
    """What Bob's key gets from every route that takes a thread id, on `thread`, changing nothing."""
    q = "?agentId=assistant"
    answers = [
        await http.get(f"/api/memory/threads/{thread}{q}", headers=BOB),
        await http.get(f"/api/memory/threads/{thread}/messages{q}", headers=BOB),
        await http.get(f"/api/memory/threads/{thread}/messages{q}&perPage=false", headers=BOB),
        await http.patch(f"/api/memory/threads/{thread}{q}", json={"title": "mine"}, headers=BOB),
        await http.delete(f"/api/memory/threads/{thread}{q}", headers=BOB),
        await http.get(f"/api/memory/threads{q}", headers=BOB),
        await http.get(f"/api/memory/threads{q}&resourceId=user-ada", headers=BOB),
    ]
    return [(a.status_code, a.json()) for a in answers]


async def test_another_resources_thread_id_answers_exactly_as_an_unknown_one(
    http: httpx.AsyncClient,
) -> None:
    unknown = await _bobs_answers(http, "t-ada")  # before Ada has it: an unknown id
    assert [status for status, _ in unknown] == [404, 404, 404, 404, 404, 200, 404], unknown
    assert unknown[0][1] == {"error": "no thread 't-ada'"}
    await _create(http, ADA, threadId="t-ada", title="Ada's")
    await http.post(
        "/api/agents/assistant/generate", json={"messages": "secret", "threadId": "t-ada"}, headers=ADA
    )
    assert await _bobs_answers(http, "t-ada") == unknown  # Ada's now: the same status, the same body
    # and Ada's thread is as she left it
    q = "?agentId=assistant"
    messages = (await http.get(f"/api/memory/threads/t-ada/messages{q}", headers=ADA)).json()["messages"]
    assert [message_text(m) for m in messages] == ["secret", demo_answer("secret")]
    assert (await http.get(f"/api/memory/threads/t-ada{q}", headers=ADA)).json()["title"] == "Ada's"


async def test_thread_ids_are_scoped_by_resource_so_nobody_squats_another_s(
    http: httpx.AsyncClient,
) -> None:
    q = "?agentId=assistant"
    # Bob takes the id first: a thread of his, which blocks nothing of Ada's
    mine = await _create(http, BOB, threadId="t-1", title="Bob's")
    assert (mine["id"], mine["resourceId"]) == ("t-1", "user-bob")
    saved = await http.post(
        f"/api/memory/save-messages{q}",
        json={"messages": [{"id": "m-1", "role": "user", "content": "bob's note", "threadId": "t-1"}]},
        headers=BOB,
    )
    assert saved.status_code == 200, saved.text
    ada = await _create(http, ADA, threadId="t-1", title="Ada's")
    assert (ada["id"], ada["resourceId"], ada["title"]) == ("t-1", "user-ada", "Ada's")
    for text in ("My name is Ada.", "What did I say?"):
        run = await http.post(
            "/api/agents/assistant/generate", json={"messages": text, "threadId": "t-1"}, headers=ADA
        )
        assert run.json()["text"] == demo_answer(text)
    bob_run = await http.post(
        "/api/agents/assistant/generate", json={"messages": "and me?", "threadId": "t-1"}, headers=BOB
    )
    assert bob_run.status_code == 200, bob_run.text
    assert "Ada" not in json.dumps(bob_run.json())  # his run never loaded her turns
    listed = {
        name: [
            message_text(m)
            for m in (await http.get(f"/api/memory/threads/t-1/messages{q}", headers=key)).json()["messages"]
        ]
        for name, key in (("ada", ADA), ("bob", BOB))
    }
    assert listed == {
        "ada": [
            "My name is Ada.",
            demo_answer("My name is Ada."),
            "What did I say?",
            demo_answer("What did I say?"),
        ],
        "bob": ["bob's note", "and me?", demo_answer("and me?")],
    }
    # deleting his deletes only his
    assert (await http.delete(f"/api/memory/threads/t-1{q}", headers=BOB)).status_code == 200
    assert (await http.get(f"/api/memory/threads/t-1{q}", headers=BOB)).status_code == 404
    assert (await http.get(f"/api/memory/threads/t-1{q}", headers=ADA)).json()["title"] == "Ada's"
    refused = await http.post(
        "/api/agents/assistant/generate",
        json={"messages": "hi", "memory": {"thread": "t-1", "resource": "user-ada"}},
        headers=BOB,
    )
    assert refused.status_code == 400


async def test_saved_messages_are_listed_and_a_retried_save_does_not_duplicate(
    http: httpx.AsyncClient,
) -> None:
    messages = [
        {"id": "m-1", "role": "user", "content": "Hello", "threadId": "t-s"},
        {
            "id": "m-2",
            "role": "assistant",
            "content": {"format": 2, "parts": [{"type": "text", "text": "Hi!"}]},
            "threadId": "t-s",
        },
    ]
    for _ in range(2):
        saved = await http.post(
            "/api/memory/save-messages?agentId=assistant", json={"messages": messages}, headers=ADA
        )
        assert saved.status_code == 200, saved.text
    assert [m["id"] for m in saved.json()["messages"]] == ["m-1", "m-2"]
    listed = (await http.get("/api/memory/threads/t-s/messages", headers=ADA)).json()
    assert [(m["id"], message_text(m)) for m in listed["messages"]] == [("m-1", "Hello"), ("m-2", "Hi!")]
    thread = (await http.get("/api/memory/threads/t-s", headers=ADA)).json()
    assert thread["resourceId"] == "user-ada"


@pytest.mark.parametrize(
    "path",
    [
        "/api/memory/threads/bad%01id",
        "/api/memory/threads/" + "x" * 300,
        "/api/memory/threads/t/messages?page=-1",
        "/api/memory/threads?perPage=0",
        "/api/memory/threads/t/messages?orderBy=notjson",
        '/api/memory/threads/t/messages?filter={"roles":["users"]}',  # a typo matches nothing
        '/api/memory/threads/t/messages?filter={"roles":5}',
        '/api/memory/threads/t/messages?filter={"roles":"user"}',
        '/api/memory/threads/t/messages?filter={"roles":[["user"]]}',  # unhashable: a 500 unchecked
        "/api/memory/threads?perPage=%C2%B2",  # a digit to str.isdigit, not to int()
    ],
)
async def test_malformed_ids_and_parameters_are_400(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path, headers=ADA)
    assert response.status_code == 400, response.text
    assert response.json()["error"]


async def test_status_config_and_agents_without_memory(http: httpx.AsyncClient) -> None:
    status = await http.get("/api/memory/status?agentId=assistant", headers=ADA)
    assert status.json() == {"result": True, "memoryType": "local"}
    assert (await http.get("/api/memory/status?agentId=plain", headers=ADA)).json()["result"] is False
    config = await http.get("/api/memory/config?agentId=assistant", headers=ADA)
    assert config.json()["config"] == {
        "lastMessages": 10,
        "readOnly": False,
        "workingMemory": {"enabled": False},
    }
    assert (await http.get("/api/memory/threads?agentId=plain", headers=ADA)).status_code == 404
    assert (await http.get("/api/memory/threads?agentId=nobody", headers=ADA)).status_code == 404
    assert (await http.post("/api/memory/threads", json={}, headers=ADA)).status_code == 400


async def test_an_operator_key_names_the_resource_it_acts_for(http: httpx.AsyncClient) -> None:
    assert (await http.get("/api/memory/threads")).status_code == 401
    await _create(http, ADA, threadId="t-op")
    listed = await http.get("/api/memory/threads?resourceId=user-ada", headers=UNBOUND)
    assert listed.status_code == 200, listed.text
    assert [t["id"] for t in listed.json()["threads"]] == ["t-op"]
    unnamed = await http.get("/api/memory/threads", headers=UNBOUND)
    assert unnamed.status_code == 400
    assert unnamed.json()["error"].startswith("resourceId: required")


async def test_a_store_that_is_down_is_503(service: Service, http: httpx.AsyncClient) -> None:
    assert service.app.store is not None
    await service.app.store.close()
    for response in (
        await http.get("/api/memory/threads", headers=ADA),
        await http.get("/api/memory/threads/t-1", headers=ADA),
        await http.post("/api/memory/threads?agentId=assistant", json={"threadId": "t-9"}, headers=ADA),
    ):
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error.endswith(": the memory store is unavailable"), error
        assert "sqlite:" not in error
        assert "postgres:" not in error


@pytest.mark.parametrize(
    ("entry", "split"),
    [
        ("key-ada=user-ada", ("key-ada", "user-ada")),
        ("plain-key", ("plain-key", None)),
        ("c2VjcmV0==", ("c2VjcmV0==", None)),  # base64 padding is no binding
        ("c2VjcmV0==user-1", ("c2VjcmV0=", "user-1")),
    ],
)
async def test_a_key_entry_binds_a_resource_after_its_last_equals_sign(
    entry: str, split: tuple[str, str | None]
) -> None:
    assert split_binding(entry) == split


@pytest_asyncio.fixture
async def trusting(backend: Backend) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    """A server behind an authenticating proxy: it trusts the request's context and resource."""
    settings = OrchestratorSettings(http_port=0, grpc_port=0, trust_request_context=True)
    async with Service(settings, parse_config(_config(backend))) as svc:
        url = f"http://127.0.0.1:{svc.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            yield client


def _context(resource: str) -> str:
    return base64.b64encode(json.dumps({"mastra__resourceId": resource}).encode()).decode()


async def test_a_tenant_key_cannot_send_a_reserved_context_key_either(http: httpx.AsyncClient) -> None:
    """A key bound to a resource names the resource itself; the memory routes read no other
    context key. A reserved key in its request context is refused, naming it (it was ignored),
    before anything is written; any other key is taken."""
    forged = await http.post(  # as client-js sends it: the query's and a copy in the body
        f"/api/memory/threads?agentId=assistant&requestContext={_context('user-bob')}",
        json={"threadId": "t-r", "requestContext": {"mastra__resourceId": "user-bob"}},
        headers=ADA,
    )
    assert forged.status_code == 400, forged.text
    assert forged.json()["error"].startswith("requestContext: 'mastra__resourceId' reserved")
    listed = await http.get(
        f"/api/memory/threads?agentId=assistant&requestContext={_context('user-bob')}", headers=ADA
    )
    assert listed.status_code == 400, listed.text
    assert "mastra__resourceId" in listed.json()["error"]
    assert (await http.get("/api/memory/threads/t-r", headers=ADA)).status_code == 404  # nothing written
    tier = base64.b64encode(json.dumps({"tier": "gold"}).encode()).decode()
    created = await http.post(
        f"/api/memory/threads?agentId=assistant&requestContext={tier}",
        json={"threadId": "t-r", "requestContext": {"tier": "gold"}},
        headers=ADA,
    )
    assert created.status_code == 200, created.text
    assert created.json()["resourceId"] == "user-ada"


async def test_the_resource_never_comes_from_the_request_context(
    trusting: httpx.AsyncClient,
) -> None:
    # mastra__resourceId is reserved: even a server that trusts every caller's context (the
    # deprecated PROCMESH_TRUST_REQUEST_CONTEXT) refuses it, naming it
    forged = await trusting.post(
        f"/api/memory/threads?agentId=assistant&resourceId=user-ada&requestContext={_context('user-ada')}",
        json={"threadId": "t-p"},
    )
    assert forged.status_code == 400
    assert forged.json()["error"].startswith("requestContext: 'mastra__resourceId' reserved")
    # with no key configured, the caller acts as an operator: it names the resource
    created = await trusting.post(
        "/api/memory/threads?agentId=assistant&resourceId=user-ada", json={"threadId": "t-p"}
    )
    assert created.json()["resourceId"] == "user-ada"
    assert (await trusting.get("/api/memory/threads/t-p?resourceId=user-ada")).status_code == 200
    assert (await trusting.get("/api/memory/threads/t-p?resourceId=user-bob")).status_code == 404
    # thread ids are scoped by resource: without one, a thread id names no thread
    unnamed = await trusting.get("/api/memory/threads/t-p")
    assert unnamed.status_code == 400
    assert unnamed.json()["error"].startswith("resourceId: required")
    assert (await trusting.get("/api/memory/threads/t-p?requestContext=%%%")).status_code == 400


async def test_a_postgres_server_that_stops_is_503_and_the_api_recovers_when_it_is_back() -> None:
    server = PostgresServer()
    await asyncio.to_thread(server.start)
    try:
        config = _config(Backend("postgres", PostgresMemoryStore, server.dsn))
        config["storage"]["timeout"] = 1.0
        settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=[SecretStr("key-ada=user-ada")])
        async with Service(settings, parse_config(config)) as svc:
            url = f"http://127.0.0.1:{svc.http_port}"
            async with httpx.AsyncClient(base_url=url, timeout=20, headers=ADA) as http:
                await _create(http, ADA, threadId="t-down")
                await asyncio.to_thread(server.halt)
                down = await http.get("/api/memory/threads/t-down")
                assert down.status_code == 503, down.text
                # the client learns what failed, never where the store is (that is in the log)
                assert down.json() == {"error": "reading the thread: the memory store is unavailable"}
                await asyncio.to_thread(server.run)
                # the pool reconnects in the background, with backoff: no restart of the orchestrator
                for _ in range(60):
                    back = await http.get("/api/memory/threads/t-down")
                    if back.status_code != 503:
                        break
                    await asyncio.sleep(0.5)
                assert back.status_code == 200, back.text
    finally:
        await asyncio.to_thread(server.stop)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": "no thread"}]},
        {"messages": [{"role": "tool", "content": "x", "threadId": "t"}]},
        {"messages": [{"role": "user", "content": "x", "threadId": "t\x00"}]},
        {
            "messages": [
                {"role": "user", "content": "x", "threadId": "t", "resourceId": "a"},
                {"resourceId": "b"},
            ]
        },
    ],
)
async def test_a_bad_save_is_400_and_saves_nothing(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await http.post("/api/memory/save-messages?agentId=assistant", json=body, headers=ADA)
    assert response.status_code == 400, response.text
    assert (await http.get("/api/memory/threads", headers=ADA)).json()["threads"] == []


async def test_a_thread_field_the_store_refuses_is_400(http: httpx.AsyncClient) -> None:
    for body in ({"title": 7}, {"metadata": "not an object"}, {"title": "x" * 2000}):
        response = await http.post("/api/memory/threads?agentId=assistant", json=body, headers=ADA)
        assert response.status_code == 400, response.text


async def test_a_grpc_call_with_a_bound_key_uses_that_resource(service: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = agrpc.AgentServiceStub(channel)
        ada = (("authorization", "Bearer key-ada"),)
        await stub.Generate(
            apb.GenerateRequest(agent_id="assistant", text="hello", thread_id="t-grpc"), metadata=ada
        )
        claim = apb.GenerateRequest(agent_id="assistant", text="hi", thread_id="t-x", resource_id="user-bob")
        with pytest.raises(grpc.aio.AioRpcError) as claimed:
            await stub.Generate(claim, metadata=ada)
        assert claimed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert service.app.store is not None
    thread = await service.app.store.get_thread("t-grpc", "user-ada")  # the key's resource
    assert thread is not None
    assert thread.resource_id == "user-ada"
    assert await service.app.store.get_thread("t-x", "user-ada") is None
    assert await service.app.store.get_thread("t-x", "user-bob") is None
