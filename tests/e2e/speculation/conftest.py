"""Shared fixtures of the speculation e2e modules: each module's `sidecars` fixture starts its own
scripted sidecars and the recorder; `ready` waits for all of them once per module."""

from __future__ import annotations

import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ready(sidecars: dict[str, SidecarProcess]) -> dict[str, SidecarProcess]:
    for proc in sidecars.values():
        await proc.wait_ready()
    return sidecars
