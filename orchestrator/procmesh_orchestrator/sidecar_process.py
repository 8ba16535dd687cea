"""Start and stop sidecar processes (the demo, scenarios and tests use real processes)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from procmesh import ProcessorClient
from procmesh.errors import ProcmeshError
from procmesh_orchestrator.config.loading import ENV_PREFIX
from procmesh_orchestrator.errors import SidecarStartError

log = logging.getLogger(__name__)

SECRET_SUFFIX = "_API_KEY"
"""A variable whose name ends so is a provider key wherever it came from: never given to a sidecar."""


@dataclass(frozen=True)
class ModelGateway:
    """Where a sidecar the orchestrator starts reaches its model gateway, and the key it presents."""

    address: str
    """``unix:///path.sock`` or ``host:port`` (the SDK's ``PROCMESH_MODEL_GATEWAY``)."""
    key: str | None = field(default=None, repr=False)
    """One of the orchestrator's own API keys (None: it has none); never a provider key."""


def sidecar_environment(
    environ: Mapping[str, str], secrets: Collection[str], gateway: ModelGateway | None
) -> dict[str, str]:
    """The environment of a sidecar the orchestrator starts: `environ` without the provider keys.

    Dropped: every variable in `secrets` (those the orchestrator reads a secret from), every
    ``*_API_KEY`` and every ``PROCMESH_CONFIG__*``. A sidecar that needs a model asks the
    gateway, so given one it gets ``PROCMESH_MODEL_GATEWAY`` and, when the orchestrator has API
    keys, ``PROCMESH_MODEL_GATEWAY_KEY``.
    """
    env = {
        k: v
        for k, v in environ.items()
        if k not in secrets
        and not k.endswith(SECRET_SUFFIX)
        and not k.startswith(ENV_PREFIX)  # the config's overrides: a DSN, say
    }
    if gateway is not None:
        env["PROCMESH_MODEL_GATEWAY"] = gateway.address
        env.pop("PROCMESH_MODEL_GATEWAY_KEY", None)  # an inherited key is not this gateway's
        if gateway.key:
            env["PROCMESH_MODEL_GATEWAY_KEY"] = gateway.key
    return env


class SidecarProcess:
    """A ``procmesh-sidecar`` child process serving on `address`, in its own session.

    `module` is the module run with ``python -m`` (default: the built-in sidecars;
    tests serve their own processors the same way); `env` is its environment (default: this
    process's own; the orchestrator gives its built-ins `sidecar_environment`).
    """

    def __init__(
        self,
        args: Sequence[str],
        address: str,
        *,
        log_path: str | None = None,
        module: str = "procmesh_sidecars",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.address = address
        self.env = env
        self.args = [sys.executable, "-m", module, *args, "--listen", address]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Spawn the process (before this process creates any gRPC object, per gRPC's fork rules)."""
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**(os.environ if self.env is None else self.env), "PYTHONUNBUFFERED": "1"}
        try:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy of the descriptor

    async def wait_ready(self, timeout: float = 20.0) -> None:
        """Poll grpc.health.v1 until SERVING; fail clearly if the process exits or times out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with ProcessorClient(self.address) as client:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise SidecarStartError(
                        f"sidecar {' '.join(self.args[2:])} exited with {self.proc.returncode}"
                        + (f" (log: {self.log_path})" if self.log_path else "")
                    )
                try:
                    if await client.health(timeout=0.5) == "SERVING":
                        return
                except ProcmeshError:
                    pass
                if loop.time() >= deadline:
                    raise SidecarStartError(f"sidecar at {self.address} not SERVING after {timeout}s")
                await asyncio.sleep(0.05)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to `grace`, then kill the process group; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


class CrashLoopBackoff:
    """How long to wait before restarting a crashed process, as kubelet does for a container.

    The delay doubles with every crash in a row, from `initial` up to `cap` seconds; a process that
    stayed up for `reset_after` seconds starts the count again. A crash-looping sidecar then costs a
    restart a minute instead of two a second, forever.
    """

    def __init__(self, initial: float = 0.5, cap: float = 60.0, reset_after: float = 30.0) -> None:
        self.initial = initial
        self.cap = cap
        self.reset_after = reset_after
        self.crashes = 0

    def next_delay(self, uptime: float) -> float:
        """The wait before the next start, after a run of `uptime` seconds that ended in a crash."""
        if uptime >= self.reset_after:
            self.crashes = 0
        delay = min(self.initial * 2.0**self.crashes, self.cap)
        self.crashes += 1
        return delay


async def supervise(
    process: SidecarProcess,
    *,
    connect_timeout: float,
    backoff: CrashLoopBackoff | None = None,
    poll: float = 0.5,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Restart `process` whenever it exits, with crash-loop backoff; runs until cancelled."""
    backoff = backoff or CrashLoopBackoff()
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        await sleep(poll)
        if process.proc is None or process.proc.poll() is None:
            continue
        delay = backoff.next_delay(loop.time() - started)
        log.error(
            "sidecar %s exited with %s; restarting in %.1fs (crash %d in a row)",
            process.address,
            process.proc.returncode,
            delay,
            backoff.crashes,
        )
        await sleep(delay)
        process.start()
        started = loop.time()
        try:
            await process.wait_ready(connect_timeout)
        except SidecarStartError as exc:
            log.error("restarted sidecar is not serving: %s", exc)
