"""Your own response-cache sidecar (tests/fixtures/cache_sidecar.py, a real process): the built-in
`ResponseCache` served with its own backend and key function, as the seeds' ``new
ResponseCache({ cache, key })``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import ProcessorFailedError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_sidecars.builtins.response_cache import ResponseCache
from tests.e2e.builtins.harness import call, make_config, model_requests, ref

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

RESPONSES = [{"text": "first answer"}, {"text": "second answer"}, {"text": "third answer"}]


@pytest.fixture(scope="module")
def cache_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="pm-cache-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess], cache_dir: Path) -> str:
    proc = start_sidecar("--dir", str(cache_dir), name="own-cache", module="tests.fixtures.cache_sidecar")
    await proc.wait_ready()
    return proc.address


@pytest.fixture(autouse=True)
def empty(cache_dir: Path) -> None:
    for entry in cache_dir.iterdir():
        entry.unlink()


def entries(folder: Path) -> list[str]:
    """The cache's entries: its backend's files."""
    return sorted(p.name for p in folder.iterdir())


def cfg(address: str, **options: object) -> Config:
    return make_config(address, input_processors=[ref("response-cache", **options)], responses=RESPONSES)


async def test_your_key_function_and_backend_serve_the_entries(address: str, cache_dir: Path) -> None:
    async with App(cfg(address)) as app:
        first = await call(app, "What is procmesh?")
        second = await call(app, "WHAT IS PROCMESH?")  # another wording, the same key
        assert first.result.text == second.result.text == "first answer"
        assert len(model_requests(app)) == 1
    assert entries(cache_dir) == ["faq:what is procmesh?.json"]


async def test_a_raising_key_function_falls_back_to_the_derived_key(address: str, cache_dir: Path) -> None:
    async with App(cfg(address)) as app:
        assert (await call(app, "boom")).result.text == "first answer"
        assert (await call(app, "boom")).result.text == "first answer"  # still cached
        assert (await call(app, "boom!")).result.text == "second answer"  # keyed by the whole prompt
        assert len(model_requests(app)) == 2
    derived = [name for name in entries(cache_dir) if name.startswith("procmesh:agent-response:a:")]
    assert len(derived) == len(entries(cache_dir)) == 2


async def test_a_per_call_key_still_wins(address: str, cache_dir: Path) -> None:
    async with App(cfg(address)) as app:
        pinned = CallOptions(request_context=ResponseCache.context(key="pinned"))
        assert (await call(app, "one", options=pinned)).result.text == "first answer"
        assert (await call(app, "two", options=pinned)).result.text == "first answer"
    assert entries(cache_dir) == ["pinned.json"]


async def test_the_options_cannot_choose_another_backend(address: str) -> None:
    async with App(cfg(address, max_size=10)) as app:
        with pytest.raises(ProcessorFailedError, match=r"sets its own backend; remove \['max_size'\]"):
            await call(app, "q")
        assert model_requests(app) == []
