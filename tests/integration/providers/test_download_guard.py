"""The attachment download guard (providers/_assets.py) against real sockets: no fetch of a
loopback, link-local, private or otherwise non-public address from a caller's URL, redirects
checked again, the name resolved once (by the guard) and every answer checked, size and time
bounded; ``downloadAllowHosts`` is the operator's documented way to allow an internal host."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.providers._assets import DownloadPolicy, download, make_download_client
from tests.integration.providers.files import FileServer

pytestmark = pytest.mark.asyncio

BODY = b"internal report"


@pytest.fixture(autouse=True)
def served(files: FileServer) -> None:
    files.files["/r.txt"] = [(200, BODY, "text/plain")]


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with make_download_client() as c:
        yield c


def policy(*allow: str, max_bytes: int = 1024, timeout: float = 5.0) -> DownloadPolicy:
    return DownloadPolicy.of(max_bytes, timeout, list(allow))


async def refused(client: httpx.AsyncClient, url: str, guard: DownloadPolicy) -> APICallError:
    with pytest.raises(APICallError) as info:
        await download(client, url, guard)
    err = info.value
    assert err.error_id == "DOWNLOAD_ASSETS_FAILED"
    assert err.details == {"url": url}
    return err


NON_PUBLIC = {
    "loopback": "http://127.0.0.1:{port}/r.txt",
    "loopback, another": "http://127.8.9.10:{port}/r.txt",
    "loopback IPv6": "http://[::1]:{port}/r.txt",
    "IPv4-mapped loopback": "http://[::ffff:127.0.0.1]:{port}/r.txt",
    "unspecified": "http://0.0.0.0:{port}/r.txt",
    "link-local (cloud metadata)": "http://169.254.169.254/latest/meta-data/",
    "link-local IPv6": "http://[fe80::1]/r.txt",
    "private 10/8": "http://10.0.0.1/r.txt",
    "private 172.16/12": "http://172.16.5.4/r.txt",
    "private 192.168/16": "http://192.168.1.1/r.txt",
    "unique local IPv6": "http://[fd00::1]/r.txt",
    "shared address space": "http://100.64.0.1/r.txt",
    "multicast": "http://224.0.0.1/r.txt",
}


@pytest.mark.parametrize("url", NON_PUBLIC.values(), ids=NON_PUBLIC.keys())
async def test_a_non_public_address_is_refused(
    client: httpx.AsyncClient, files: FileServer, url: str
) -> None:
    url = url.format(port=files.port)
    err = await refused(client, url, policy())
    assert "non-public address" in err.message
    assert files.hits == {}  # refused before connecting


async def test_a_name_resolving_to_loopback_is_refused(client: httpx.AsyncClient, files: FileServer) -> None:
    err = await refused(client, files.url("/r.txt", host="localhost"), policy())
    assert "localhost resolves to" in err.message
    assert files.hits == {}


async def test_the_allow_list_admits_an_internal_network(
    client: httpx.AsyncClient, files: FileServer
) -> None:
    assert await download(client, files.url("/r.txt"), policy("127.0.0.0/8")) == (BODY, "text/plain")
    # a network that does not hold the address admits nothing
    await refused(client, files.url("/r.txt"), policy("10.0.0.0/8"))


async def test_an_allowed_name_is_resolved_once_and_the_checked_address_is_connected_to(
    client: httpx.AsyncClient, files: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    resolve = loop.getaddrinfo
    looked_up: list[Any] = []

    async def counting(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        return await resolve(host, *args, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", counting)
    url = files.url("/r.txt", host="localhost")
    assert await download(client, url, policy("localhost")) == (BODY, "text/plain")
    # the name is looked up by the guard only: a second answer (DNS rebinding) is never used
    assert looked_up.count("localhost") == 1
    assert files.hosts == [f"localhost:{files.port}"]  # the server still sees the name


async def test_every_resolved_address_must_be_allowed(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()

    async def mixed(host: Any, port: Any, **kwargs: Any) -> Any:
        stream = socket.SOCK_STREAM
        return [
            (socket.AF_INET, stream, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, stream, 6, "", ("10.1.2.3", port)),
        ]

    monkeypatch.setattr(loop, "getaddrinfo", mixed)
    err = await refused(client, "http://files.example.com/r.txt", policy())
    assert "10.1.2.3" in err.message


async def test_a_redirect_to_a_non_public_address_is_refused(
    client: httpx.AsyncClient, files: FileServer
) -> None:
    files.files["/moved"] = [(302, b"http://169.254.169.254/latest/meta-data/", "text/plain")]
    err = await refused(client, files.url("/moved"), policy("127.0.0.1"))
    assert "169.254.169.254" in err.message
    assert files.hits == {"/moved": 1}


async def test_a_redirect_to_an_allowed_address_is_followed(
    client: httpx.AsyncClient, files: FileServer
) -> None:
    files.files["/moved"] = [(302, b"/r.txt", "text/plain")]
    assert await download(client, files.url("/moved"), policy("127.0.0.1")) == (BODY, "text/plain")


async def test_only_http_urls_are_downloaded(client: httpx.AsyncClient) -> None:
    err = await refused(client, "file:///etc/passwd", policy())
    assert "only http and https" in err.message


async def test_a_body_over_the_size_limit_is_refused(client: httpx.AsyncClient, files: FileServer) -> None:
    err = await refused(client, files.url("/r.txt"), policy("127.0.0.1", max_bytes=len(BODY) - 1))
    assert "downloadMaxBytes" in err.message


async def test_a_download_that_never_ends_is_cut_at_the_timeout(client: httpx.AsyncClient) -> None:
    connections: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.read(1024)  # the request arrives; no answer ever does

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        err = await refused(client, f"http://127.0.0.1:{port}/r.txt", policy("127.0.0.1", timeout=0.2))
        for writer in connections:
            writer.close()
            await writer.wait_closed()
    assert "downloadTimeout" in err.message


async def test_the_message_hides_a_signed_urls_query(client: httpx.AsyncClient, files: FileServer) -> None:
    url = files.url("/missing.txt") + "?X-Amz-Signature=secret"
    err = await refused(client, url, policy("127.0.0.1"))
    assert "secret" not in err.message
    assert "HTTP 404" in err.message


async def test_an_allowed_name_matches_however_it_is_spelt() -> None:
    guard = policy("Intranet.EXAMPLE.", "bücher.example")
    internal = ipaddress.ip_address("10.0.0.5")
    assert guard.allows("intranet.example", internal)
    assert guard.allows("xn--bcher-kva.example", internal)  # the URL's host as DNS spells it
    assert not guard.allows("other.example", internal)
