"""The sidecars one config names, connected: a channel each and what each hosts (``Describe``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from procmesh import ProcessorClient, channel_credentials
from procmesh.errors import ProcmeshError
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.config import SidecarConfig
from procmesh_orchestrator.errors import ConfigError


class SidecarCatalog:
    """One channel per sidecar and its `Describe` answer: processors, hosted tools, fusing.

    `connect()` opens the channels and waits (up to `connect_timeout`) for every sidecar to
    answer `Describe`; a sidecar that does not is a `ConfigError` naming it. `close()` closes
    the channels.
    """

    def __init__(self, sidecars: Mapping[str, SidecarConfig], *, connect_timeout: float = 10.0) -> None:
        self.sidecars: dict[str, SidecarConfig] = dict(sidecars)
        self.connect_timeout = connect_timeout
        self.clients: dict[str, ProcessorClient] = {}
        self.processors: dict[str, dict[str, ppb.ProcessorInfo]] = {}
        """Each sidecar's processors (Describe), by id."""
        self.tools: dict[str, dict[str, ppb.HostedTool]] = {}
        """Each sidecar's hosted tools (Describe), by name."""
        self.fusing: set[str] = set()
        """The sidecars whose Describe says they run fused requests."""

    async def connect(self) -> None:
        """Open a channel to every sidecar and read what it hosts."""
        for name, sidecar in self.sidecars.items():
            tls = sidecar.tls
            credentials = channel_credentials(tls.ca, tls.cert, tls.key) if tls else None
            self.clients[name] = ProcessorClient(
                sidecar.address, credentials=credentials, server_name=tls.server_name if tls else None
            )
        await asyncio.gather(*(self._describe(name) for name in self.clients))

    async def _describe(self, name: str) -> None:
        client = self.clients[name]
        deadline = asyncio.get_running_loop().time() + self.connect_timeout
        while True:
            try:
                described = await client.describe(timeout=1.0)
                break
            except ProcmeshError as exc:
                if asyncio.get_running_loop().time() >= deadline:
                    raise ConfigError(
                        f"sidecars.{name}: cannot reach {client.address} "
                        f"within {self.connect_timeout}s: {exc}"
                    ) from None
                await asyncio.sleep(0.1)
        self.processors[name] = {p.id: p for p in described.processors}
        self.tools[name] = {t.name: t for t in described.tools}
        if described.fuses:
            self.fusing.add(name)

    async def close(self) -> None:
        """Close every channel."""
        await asyncio.gather(*(c.close() for c in self.clients.values()))
