"""A sidecar dies under load, restarts, runs in shadow mode, or speaks TLS: real processes throughout."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.metrics import MONITOR_DECISIONS
from procmesh_orchestrator.run import RunResult
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.fixtures.pki import make_pki

pytestmark = pytest.mark.e2e

FAULTY = "tests.fixtures.faulty"
RUNS = 100
WORDS = 100  # streamed 40 ms apart: each run is mid-stream for 4 s, while 100 runs start under load


def config(
    sidecar: dict[str, Any],
    *,
    output: list[Any] = (),
    inputs: list[Any] = (),  # type: ignore[assignment]
    model: dict[str, Any] | None = None,
) -> Config:
    return parse_config(
        {
            "sidecars": {"s": sidecar},
            "models": {
                "m": model or {"provider": "scripted", "responses": [{"text": "one two three"}] * (RUNS + 5)}
            },
            "agents": {
                "a": {
                    "model": "m",
                    "errorProcessorDefaults": False,
                    "inputProcessors": list(inputs),
                    "outputProcessors": list(output),
                }
            },
        },
        "test config",
    )


def sample(app: App, name: str, **labels: str) -> float:
    return app.metrics.total(name, **labels)


def decisions(app: App, hook: str) -> dict[str, float]:
    """What monitored entries would have done in `hook`, by decision (those that happened)."""
    counts = {
        w: sample(app, "procmesh_monitor_decisions_total", hook=hook, would=w) for w in MONITOR_DECISIONS
    }
    return {w: n for w, n in counts.items() if n}


async def stream(
    app: App, text: str = "hi", first_delta: Callable[[], None] | None = None
) -> tuple[list[dict[str, Any]], RunResult]:
    """The run's chunks and result; `first_delta` is called as its first text delta arrives."""
    run = app.agent("a").stream(text)
    chunks = []
    async for chunk in run:
        if first_delta is not None and chunk["type"] == "text-delta":
            first_delta()
            first_delta = None
        chunks.append(chunk)
    return chunks, await run.result()


# -- a sidecar killed under load ------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
async def test_sidecar_killed_mid_stream_under_100_runs(tmp_path: Path, policy: str) -> None:
    """No run hangs; fail-closed runs end with the named error, fail-open ones complete; counters match."""
    address = f"unix://{tmp_path / 'c.sock'}"
    sidecar = SidecarProcess([], address, module=FAULTY, log_path=str(tmp_path / "c.log"))
    sidecar.start()
    try:
        await sidecar.wait_ready()
        slow = {
            "provider": "scripted",
            "delayMs": 40,
            "responses": [{"text": " ".join(["w"] * WORDS)}] * RUNS,
        }
        cfg = config(
            {"address": address, "timeout": 5, "onFailure": policy}, output=["s/counter"], model=slow
        )
        async with App(cfg) as app:
            streaming: list[None] = []
            all_streaming = asyncio.Event()

            def one_more() -> None:
                streaming.append(None)
                if len(streaming) == RUNS:
                    all_streaming.set()

            runs = [asyncio.create_task(stream(app, first_delta=one_more)) for _ in range(RUNS)]
            # every run is mid-stream: its first delta came through the counter, and none has ended
            # (a condition, not a fixed sleep: under load 0.3 s left some runs not yet started)
            await asyncio.wait_for(all_streaming.wait(), timeout=30)
            assert not any(run.done() for run in runs), "a run ended before the kill"
            assert sidecar.proc is not None
            os.kill(sidecar.proc.pid, signal.SIGKILL)
            done = await asyncio.wait_for(asyncio.gather(*runs), timeout=30)  # no run hangs
            results = [result for _, result in done]
            failed = [r for r in results if r.error is not None]
            if policy == "fail-closed":
                assert len(failed) == RUNS
                for r in failed:
                    assert "processor 'counter' failed in process_output_stream" in r.error  # type: ignore[operator]
                assert (
                    sample(
                        app,
                        "procmesh_processor_calls_total",
                        processor="counter",
                        hook="process_output_stream",
                        outcome="failed",
                    )
                    == RUNS
                )
            else:
                assert failed == []
                assert all(r.text == " ".join(["w"] * WORDS) for r in results)
                assert (
                    sample(
                        app,
                        "procmesh_processor_failures_let_through_total",
                        processor="counter",
                        hook="process_output_stream",
                    )
                    == RUNS
                )
    finally:
        sidecar.stop(grace=1)


async def test_a_restarted_sidecar_is_used_again(tmp_path: Path) -> None:
    address = f"unix://{tmp_path / 'r.sock'}"
    sidecar = SidecarProcess(["examples"], address, log_path=str(tmp_path / "r.log"))
    sidecar.start()
    try:
        await sidecar.wait_ready()
        cfg = config({"address": address, "timeout": 2}, inputs=["s/pii-redactor"])
        async with App(cfg) as app:
            _, ok = await stream(app)
            assert ok.error is None
            sidecar.stop(grace=0.5)
            _, down = await stream(app)
            assert down.error is not None
            assert "pii-redactor" in down.error
            sidecar.start()  # same socket path
            await sidecar.wait_ready()
            deadline = time.monotonic() + 10
            while True:  # the channel reconnects with backoff (at most 2 s between attempts)
                _, again = await stream(app)
                if again.error is None or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert again.error is None, again.error
    finally:
        sidecar.stop(grace=1)


# -- shadow mode ------------------------------------------------------------------------------


async def test_shadow_processors_are_recorded_not_enforced(tmp_path: Path) -> None:
    # ``shadow`` is the former name of ``mode: monitor`` (tests/e2e/test_monitor_mode.py)
    address = f"unix://{tmp_path / 'sh.sock'}"
    sidecar = SidecarProcess(["examples"], address, log_path=str(tmp_path / "sh.log"))
    sidecar.start()
    try:
        await sidecar.wait_ready()
        cfg = config(
            {"address": address},
            inputs=[{"processor": "s/topic-guard", "mode": "shadow"}],
            output=[{"processor": "s/word-filter", "mode": "shadow", "options": {"words": ["three"]}}],
        )
        async with App(cfg) as app:
            chunks, result = await stream(app, "please jailbreak")
            assert result.tripwire is None
            assert result.error is None
            assert result.text == "one two three"  # the shadow word-filter's masking is not applied
            assert not [c for c in chunks if c["type"] == "tripwire"]
            assert decisions(app, "process_input") == {"abort": 1}
            # two text deltas and the step's step-finish pass; "three" would be masked
            assert decisions(app, "process_output_stream") == {"pass": 3, "rewrite": 1}
    finally:
        sidecar.stop(grace=1)


# -- TLS and mTLS ------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_mtls_between_orchestrator_and_sidecar(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    address = f"127.0.0.1:{_free_port()}"
    sidecar = SidecarProcess(
        [
            "examples",
            "--tls-cert",
            pki["server_cert"],
            "--tls-key",
            pki["server_key"],
            "--tls-client-ca",
            pki["ca"],
        ],
        address,
        log_path=str(tmp_path / "tls.log"),
    )
    sidecar.start()
    try:
        tls = {
            "ca": pki["ca"],
            "cert": pki["client_cert"],
            "key": pki["client_key"],
            "serverName": "localhost",
        }
        cfg = config({"address": address, "tls": tls}, inputs=["s/pii-redactor"])
        async with App(cfg, connect_timeout=15) as app:
            result = await app.agent("a").generate("write to jane@example.com")
            assert result.error is None
        # without a client certificate the handshake fails: the sidecar is unreachable
        no_cert = config(
            {"address": address, "tls": {"ca": pki["ca"], "serverName": "localhost"}},
            inputs=["s/pii-redactor"],
        )
        with pytest.raises(ConfigError, match="cannot reach"):
            async with App(no_cert, connect_timeout=1.5):
                pass
        # plaintext to a TLS sidecar fails the same way
        with pytest.raises(ConfigError, match="cannot reach"):
            async with App(config({"address": address}, inputs=["s/pii-redactor"]), connect_timeout=1.5):
                pass
    finally:
        sidecar.stop(grace=1)


async def test_tls_config_needs_cert_and_key_together() -> None:
    with pytest.raises(ConfigError, match=r"cert and tls\.key go together"):
        config({"address": "127.0.0.1:1", "tls": {"ca": "ca.pem", "cert": "c.pem"}})


async def test_a_sidecar_refuses_half_a_tls_pair(tmp_path: Path) -> None:
    sidecar = SidecarProcess(
        ["examples", "--tls-cert", str(tmp_path / "x.pem")],
        f"127.0.0.1:{_free_port()}",
        log_path=str(tmp_path / "half.log"),
    )
    sidecar.start()
    assert sidecar.proc is not None
    assert await asyncio.to_thread(sidecar.proc.wait, 20) != 0
    assert "TLS needs both --tls-cert and --tls-key" in (tmp_path / "half.log").read_text()
