"""Attachments a model cannot fetch itself: the provider downloads them before the call.

A file part's URL comes from a caller, so the download is guarded: only http(s); the
host name is resolved here and EVERY address it resolves to must be public (not
loopback, link-local, private, shared, reserved or multicast) unless the provider's
``downloadAllowHosts`` names the host or a network holding the address; the
connection then goes to the address that was checked (a second DNS answer cannot
swap in an internal one), each redirect is checked the same way, and the body is
bounded in size (``downloadMaxBytes``) and the whole download in time
(``downloadTimeout``). No proxy from the environment is used.

A failure is an `APICallError` with id ``DOWNLOAD_ASSETS_FAILED`` and the URL in
``details.url``: it reaches processAPIError like a rejection, and when nothing
recovers it the run retries once with a placeholder (run/attachments.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run.attachments import DOWNLOAD_FAILED, placeholder
from procmesh_orchestrator.run.models import ModelRequest

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class DownloadPolicy:
    """How far a provider's downloads may go: size, time, and the internal hosts an operator allows."""

    max_bytes: int
    timeout: float
    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[_Network, ...] = ()

    @classmethod
    def of(cls, max_bytes: int, timeout: float, allow: list[str]) -> DownloadPolicy:
        """From the provider's settings: each ``allow`` entry is a network (``10.1.0.0/16``,
        ``127.0.0.1``) or else a host name."""
        hosts, networks = set(), []
        for entry in allow:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(_ascii_name(entry))
        return cls(max_bytes, timeout, frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: _Address) -> bool:
        """Whether `address` (one of `host`'s) may be connected to."""
        if _ascii_name(host) in self.allow_hosts:
            return True
        if any(address in net for net in self.allow_networks):
            return True
        return is_public(address)


def _ascii_name(host: str) -> str:
    """A host name as DNS compares it: lower case, no final dot, internationalized names in IDNA."""
    name = host.lower().rstrip(".")
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return name


def is_public(address: _Address) -> bool:
    """A globally routable unicast address (an IPv4-mapped IPv6 address is judged as its IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class DownloadError(Exception):
    """Why one download failed (becomes the DOWNLOAD_ASSETS_FAILED message)."""


def failed(url: str, reason: str) -> APICallError:
    """The DOWNLOAD_ASSETS_FAILED error: the message names the URL without its query (signed URLs
    carry secrets there); ``details.url`` holds it whole for a processor to match."""
    try:
        shown = str(httpx.URL(url).copy_with(query=None, fragment=None))
    except (httpx.InvalidURL, TypeError):
        shown = url[:200]
    return APICallError(
        f"Failed to download asset: {shown} ({reason})",
        status=0,
        retryable=False,
        error_id=DOWNLOAD_FAILED,
        details={"url": url},
    )


async def _checked_address(host: str, port: int, policy: DownloadPolicy) -> str:
    """The address to connect to: `host` resolved, every answer allowed by `policy`."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise DownloadError(f"cannot resolve {host}: {exc}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses:
        raise DownloadError(f"{host} resolves to no address")
    for address in addresses:
        if not policy.allows(host, address):
            raise DownloadError(
                f"{host} resolves to {address}, a non-public address (allow it with downloadAllowHosts)"
            )
    return str(addresses[0])


async def _fetch(client: httpx.AsyncClient, url: str, policy: DownloadPolicy) -> tuple[bytes, str | None]:
    for _ in range(MAX_REDIRECTS + 1):
        target = httpx.URL(url)
        if target.scheme not in ("http", "https") or not target.host:
            raise DownloadError("only http and https URLs are downloaded")
        port = target.port or (443 if target.scheme == "https" else 80)
        host = target.raw_host.decode("ascii")  # an internationalized name as DNS and TLS know it
        address = await _checked_address(host, port, policy)
        request = client.build_request(
            "GET",
            target.copy_with(host=address),
            headers={"Host": target.netloc.decode("ascii").rsplit("@", 1)[-1]},
            extensions={"sni_hostname": host},
        )
        response = await client.send(request, stream=True)
        try:
            if response.is_redirect and "location" in response.headers:
                url = str(target.join(response.headers["location"]))
                continue
            if response.status_code >= 400:
                raise DownloadError(f"HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > policy.max_bytes:
                raise DownloadError(f"{declared} bytes is over downloadMaxBytes {policy.max_bytes}")
            body = bytearray()
            async for piece in response.aiter_bytes():
                body.extend(piece)
                if len(body) > policy.max_bytes:
                    raise DownloadError(f"over downloadMaxBytes {policy.max_bytes}")
            media_type = response.headers.get("content-type", "").split(";", 1)[0].strip() or None
            return bytes(body), media_type
        finally:
            await response.aclose()
    raise DownloadError(f"more than {MAX_REDIRECTS} redirects")


async def download(client: httpx.AsyncClient, url: str, policy: DownloadPolicy) -> tuple[bytes, str | None]:
    """The body at `url` and its media type; a DOWNLOAD_ASSETS_FAILED `APICallError` otherwise."""
    try:
        async with asyncio.timeout(policy.timeout):
            return await _fetch(client, url, policy)
    except TimeoutError:
        raise failed(url, f"not done within downloadTimeout {policy.timeout:g}s") from None
    except DownloadError as exc:
        raise failed(url, str(exc)) from None
    except httpx.HTTPError as exc:
        raise failed(url, f"{type(exc).__name__}: {exc}") from None


def make_download_client() -> httpx.AsyncClient:
    """The downloads' own client: no proxy or netrc from the environment, no automatic redirects
    (each hop is checked), TLS verified against the URL's host name."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False)


def _undecodable(data: Any) -> bool:
    """A ``data:`` URL (or bare base64 text) whose bytes cannot be decoded."""
    if not isinstance(data, str) or data.startswith(("http://", "https://")):
        return False
    payload = data
    if data.startswith("data:"):
        head, sep, payload = data.partition(",")
        if not sep:
            return True
        if not head.endswith(";base64"):
            return False
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return True
    return False


async def fetch_assets(
    request: ModelRequest,
    model_fetches: Callable[[str], bool],
    client: httpx.AsyncClient,
    policy: DownloadPolicy,
) -> ModelRequest:
    """`request` with the user turns' file URLs the model cannot fetch replaced by their bytes.

    An undecodable ``data:`` URL becomes the placeholder text at once (a retry cannot repair it).
    """
    prompt: list[dict[str, Any]] = []
    changed = False
    for msg in request.prompt:
        content = msg.get("content")
        if msg.get("role") != "user" or not isinstance(content, list):
            prompt.append(msg)
            continue
        parts = []
        for part in content:
            if part.get("type") == "file":
                new = await _resolved(part, model_fetches, client, policy)
                changed = changed or new is not part
                part = new
            parts.append(part)
        prompt.append({**msg, "content": parts})
    return replace(request, prompt=prompt) if changed else request


async def _resolved(
    part: dict[str, Any],
    model_fetches: Callable[[str], bool],
    client: httpx.AsyncClient,
    policy: DownloadPolicy,
) -> dict[str, Any]:
    data = part.get("data")
    media_type = str(part.get("mediaType") or "")
    if _undecodable(data):
        log.warning("an attachment's data URL cannot be decoded; the model sees a placeholder instead")
        return placeholder(part)
    if not isinstance(data, str) or not data.startswith(("http://", "https://")) or model_fetches(media_type):
        return part
    body, served_type = await download(client, data, policy)
    return {**part, "data": body, "mediaType": media_type or served_type or "application/octet-stream"}
