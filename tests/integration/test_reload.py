"""`ConfigReloader` on an in-process App over a real `examples` sidecar process: what a swap keeps
open and for how long, and the outcomes the service's process tests cannot reach one by one."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from procmesh.errors import ProcmeshError
from procmesh_orchestrator.app import App, ConfigReloader, config_hash
from procmesh_orchestrator.config import load_config, parse_config
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = pytest.mark.asyncio(loop_scope="module")


def config(sidecar: str, words: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "sidecars": {"guards": {"address": sidecar}},
        "agents": {
            "a": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "outputProcessors": [{"processor": "guards/word-filter", "options": {"words": words}}],
            }
        },
        **extra,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecar(start_sidecar: Callable[..., SidecarProcess]) -> str:
    proc = start_sidecar("examples", name="reload-app")
    await proc.wait_ready()
    return proc.address


@pytest_asyncio.fixture(loop_scope="module")
async def app(sidecar: str, tmp_path: Path) -> AsyncIterator[tuple[App, ConfigReloader, Path]]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(sidecar, ["darn"])), encoding="utf-8")
    async with App(load_config(path)) as app:
        reloader = ConfigReloader(app, str(path), poll_seconds=0)
        reloader.start()
        yield app, reloader, path
        await reloader.stop()


async def closed(client: Any) -> bool:
    """Whether the channel is closed (a call on it is refused at once, not sent)."""
    try:
        await client.describe(timeout=2.0)
    except ProcmeshError:
        return True
    except asyncio.CancelledError:
        # grpc.aio cancels a call in flight when its channel closes under it: closed, unless it is
        # this task that is being cancelled (then the cancellation goes on)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return True
    except Exception as exc:  # grpc's UsageError: "Channel is closed"
        return "closed" in str(exc).lower()
    return False


async def test_an_agent_taken_before_a_swap_runs_on_its_pipeline_which_closes_only_after(
    app: tuple[App, ConfigReloader, Path], sidecar: str
) -> None:
    application, reloader, path = app
    old = application.pipeline
    taken = application.agent("a")  # a request took its agent ...
    path.write_text(yaml.safe_dump(config(sidecar, ["demo"])), encoding="utf-8")
    assert await reloader.reload() == "applied"  # ... just before the swap
    assert application.pipeline is not old
    await asyncio.sleep(0.3)  # the old one is retiring: three of its 0.1 s checks
    assert not await closed(old.sidecars.clients["guards"])
    result = await taken.generate("hello")  # runs on the pipeline it was taken from
    assert "****" in result.text  # the old filter: "Darn" masked ...
    assert "demo" in result.text  # ... and "demo" kept
    fresh = await application.agent("a").generate("hello")
    assert "Darn" in fresh.text  # the new one keeps "Darn" ...
    assert "****" in fresh.text  # ... and masks "demo"
    del taken, result
    gc.collect()
    for _ in range(50):  # retiring checks every 0.1 s
        if await closed(old.sidecars.clients["guards"]):
            break
        await asyncio.sleep(0.1)
    assert await closed(old.sidecars.clients["guards"]), "the old pipeline was never closed"
    assert not await closed(application.pipeline.sidecars.clients["guards"])


async def test_unchanged_content_swaps_nothing(app: tuple[App, ConfigReloader, Path], sidecar: str) -> None:
    application, reloader, path = app
    before = application.pipeline
    text = yaml.safe_dump(config(sidecar, ["darn"]), sort_keys=False)
    path.write_text("# a comment, keys in another order\n" + text, encoding="utf-8")
    assert await reloader.reload() == "unchanged"
    assert application.pipeline is before
    assert application.version == config_hash(parse_config(config(sidecar, ["darn"])))
    counted = application.metrics.registry.get_sample_value(
        "procmesh_config_reloads_total", {"outcome": "unchanged"}
    )
    assert counted == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"durable": {"leaseSeconds": 60}}, "durable: changed, and it needs a restart"),
        (
            {"sidecars": {"guards": {"address": "unix:///nonexistent/x.sock"}}},
            "sidecars.guards: cannot reach",
        ),
        (
            {"tools": {"t": {"sidecar": "guards", "tool": "nope"}}},
            "tools.t: sidecar 'guards' does not host tool",
        ),
    ],
    ids=["restart-only", "unreachable-sidecar", "tool-not-hosted"],
)
async def test_a_refused_reload_keeps_the_pipeline_and_closes_what_it_opened(
    app: tuple[App, ConfigReloader, Path],
    sidecar: str,
    change: dict[str, Any],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    application, reloader, path = app
    application.connect_timeout = 1.0  # the unreachable sidecar is given up on after 1 s
    before = application.pipeline
    path.write_text(yaml.safe_dump({**config(sidecar, ["darn"]), **change}), encoding="utf-8")
    assert await reloader.reload() == "refused"
    assert application.pipeline is before
    (line,) = [r.getMessage() for r in caplog.records if "refused, still serving" in r.getMessage()]
    assert reason in line, line
    assert "\n" not in line
    assert "****" in (await application.agent("a").generate("hello")).text


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            {"providers": {"mine": {"kind": "openai", "apiKeyEnv": "PM_RELOAD_NEW_KEY"}}},
            "providers.mine.apiKeyEnv",
        ),
        (
            {"judgeCache": {"enabled": True, "redis": {"urlEnv": "PM_RELOAD_NEW_KEY"}}},
            "judgeCache.redis.urlEnv",
        ),
    ],
    ids=["provider-key", "judge-cache-url"],
)
async def test_a_new_secret_variable_is_refused_while_the_builtins_sidecar_runs(
    sidecar: str, tmp_path: Path, change: dict[str, Any], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The built-in sidecar's environment was made without the secrets the config named at its
    start: a reload naming a new one is refused, naming the key that names it."""
    with_defaults = config(sidecar, ["darn"])
    with_defaults["agents"]["a"]["errorProcessorDefaults"] = True  # the built-in sidecar runs
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(with_defaults), encoding="utf-8")
    async with App(load_config(path)) as application:
        assert application.builtins is not None
        reloader = ConfigReloader(application, str(path), poll_seconds=0)
        before = application.pipeline
        path.write_text(yaml.safe_dump({**with_defaults, **change}), encoding="utf-8")
        assert await reloader.reload() == "refused"
        assert application.pipeline is before
    (line,) = [r.getMessage() for r in caplog.records if "refused, still serving" in r.getMessage()]
    assert f"{key}: names the secret variable(s) PM_RELOAD_NEW_KEY" in line, line
