"""``GET /api/mcp/v0/servers`` (``@mastra/client-js`` ``getMcpServers``) over real HTTP: a page of
the configured MCP servers, ``next`` the next page's URL in the form asked (``page``/``perPage``, or
the older ``offset``/``limit``) until the last, and both forms of one setting at once a 400 naming
them, never one of them silently ignored."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

NAMES = ["m0", "m1", "m2", "m3", "m4"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    config = {
        # no agent takes their tools: listing them reaches none of them
        "mcpServers": {name: {"url": f"http://127.0.0.1:9/{name}"} for name in reversed(NAMES)},
        "models": {"answer": {"provider": "demo"}},
        "agents": {"a": {"model": "answer", "errorProcessorDefaults": False}},
    }
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    async with (
        Service(settings, parse_config(config)) as service,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client,
    ):
        yield client


async def _ids(http: httpx.AsyncClient, url: str) -> tuple[list[str], str | None]:
    response = await http.get(url)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total_count"] == len(NAMES)
    return [s["id"] for s in body["servers"]], body["next"]


@pytest.mark.parametrize(
    "query",
    # an offset or a limit asks in the older form: next is in it too, with only its own keys
    ["perPage=2", "page=0&perPage=2", "limit=2&offset=0", "limit=2", "perPage=2&offset=0"],
)
async def test_next_walks_every_page_to_the_last(http: httpx.AsyncClient, query: str) -> None:
    older = "limit=" in query or "offset=" in query
    seen: list[str] = []
    url: str | None = f"/api/mcp/v0/servers?{query}"
    pages = 0
    while url is not None:
        ids, url = await _ids(http, url)
        seen += ids
        pages += 1
        if url is not None:  # the form the caller asked in
            assert ("offset=" in url, "page=" in url) == (older, not older), url
    assert (seen, pages) == (NAMES, 3)


async def test_one_page_of_all_has_no_next(http: httpx.AsyncClient) -> None:
    assert await _ids(http, "/api/mcp/v0/servers") == (NAMES, None)
    assert await _ids(http, "/api/mcp/v0/servers?page=1&perPage=3") == (["m3", "m4"], None)
    # a last page that ends at the last server: no next to an empty page
    assert await _ids(http, f"/api/mcp/v0/servers?perPage={len(NAMES)}") == (NAMES, None)
    assert await _ids(http, "/api/mcp/v0/servers?offset=3&limit=2") == (["m3", "m4"], None)


@pytest.mark.parametrize(
    ("query", "named"),
    [("perPage=2&limit=3", "perPage and limit"), ("page=1&offset=0", "page and offset")],
)
async def test_both_forms_of_one_setting_are_a_400_naming_them(
    http: httpx.AsyncClient, query: str, named: str
) -> None:
    response = await http.get(f"/api/mcp/v0/servers?{query}")
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{named}: give one")


@pytest.mark.parametrize("query", ["perPage=%C2%B2", "page=%C2%B2", "offset=%C2%B2", "limit=%C2%B2"])
async def test_a_number_in_digits_int_does_not_read_is_a_400(http: httpx.AsyncClient, query: str) -> None:
    # "²" is a digit to str.isdigit, not to int(): once a 500 (ValueError) instead of the 400
    response = await http.get(f"/api/mcp/v0/servers?{query}")
    assert response.status_code == 400, response.text
