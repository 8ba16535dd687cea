"""A `PodPlan` as running processes, in the kubelet's order.

Init containers run in order, each to completion; a native sidecar (``restartPolicy: Always``)
counts as started once its startup probe passes; then the main containers start, and the pod is
ready when every readiness probe passes. SIGTERM/SIGINT stops the main containers first and then
the sidecars in reverse order, within ``terminationGracePeriodSeconds``.

Probes poll every `POLL_SECONDS` instead of every ``periodSeconds`` (so a local pod starts fast)
but keep Kubernetes' budget: ``initialDelaySeconds + periodSeconds * failureThreshold``. A
container that exits stops the pod (the kubelet would restart it; locally the failure is what you
want to see).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh_orchestrator.cli.pod.plan import ContainerPlan, PodPlan, Probe
from procmesh_orchestrator.errors import DeployError

POLL_SECONDS = 0.1
"""How often a local probe polls (the kubelet polls every periodSeconds)."""


class _Stopped(Exception):
    """SIGTERM/SIGINT arrived while the pod was starting."""


@dataclass
class _Running:
    plan: ContainerPlan
    proc: asyncio.subprocess.Process
    pump: asyncio.Task[None]


async def probe_once(probe: Probe, env: dict[str, str] | None = None) -> str | None:
    """Run `probe` once: None when it passes, else why it failed."""
    try:
        if probe.action == "grpc":
            async with grpc.aio.insecure_channel(f"{probe.host}:{probe.port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                response = await stub.Check(
                    health_pb2.HealthCheckRequest(service=probe.service), timeout=probe.timeout
                )
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            return None if status == "SERVING" else str(status)
        if probe.action == "httpGet":
            url = f"{probe.scheme.lower()}://{probe.host}:{probe.port}{probe.path}"
            async with httpx.AsyncClient(timeout=probe.timeout, verify=False) as client:
                code = (await client.get(url)).status_code
            return None if 200 <= code < 400 else f"HTTP {code}"
        if probe.action == "tcpSocket":
            _, writer = await asyncio.wait_for(asyncio.open_connection(probe.host, probe.port), probe.timeout)
            writer.close()
            return None
        proc = await asyncio.create_subprocess_exec(
            *probe.command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            code = await asyncio.wait_for(proc.wait(), probe.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return "timed out"
        return None if code == 0 else f"exit code {code}"
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    except (OSError, TimeoutError, httpx.HTTPError) as exc:
        return f"{type(exc).__name__}: {exc}"


class LocalPod:
    """Runs a `PodPlan`: start in the kubelet's order, wait for probes, stop in reverse."""

    def __init__(self, plan: PodPlan, out: TextIO | None = None) -> None:
        self.plan = plan
        self.out = out or sys.stdout
        self.stop_requested = asyncio.Event()
        self.ready = asyncio.Event()
        self._running: list[_Running] = []

    def log(self, message: str) -> None:
        """A line of the pod's own output (container output is prefixed with its name)."""
        self.out.write(f"pod: {message}\n")
        self.out.flush()

    async def run(self) -> int:
        """Start the pod, wait for a stop signal or a failure, stop it; the exit code (0: clean)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        failure: str | None = None
        try:
            await self._start()
            self.log(f"ready: {self.plan.name} (Ctrl-C or SIGTERM stops it)")
            self.ready.set()
            failure = await self._watch()
        except _Stopped:
            self.log("stop requested during start-up")
        except DeployError as exc:
            failure = str(exc)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            codes = await self._stop()
        if failure:
            self.log(f"failed: {failure}")
            return 1
        unclean = {name: code for name, code in codes.items() if code != 0}
        if unclean:
            self.log(f"containers that did not exit cleanly: {unclean}")
            return 1
        self.log("stopped")
        return 0

    async def _start(self) -> None:
        for container in self.plan.containers:
            if container.role == "main":
                continue
            running = await self._spawn(container)
            if container.role == "init":
                code = await self._until(running.proc.wait(), running)
                await running.pump
                self._running.remove(running)
                if code != 0:
                    raise DeployError(f"init container {container.name!r} exited with {code}")
                self.log(f"init container {container.name} completed")
            elif container.startup is not None:
                await self._await_probe(running, container.startup, "startup", deadline=True)
                self.log(f"sidecar {container.name} started ({container.startup.describe()} passed)")
            else:
                self.log(f"sidecar {container.name} started (no startup probe)")
        mains = [await self._spawn(c) for c in self.plan.containers if c.role == "main"]
        for running in mains:
            if running.plan.startup is not None:
                await self._await_probe(running, running.plan.startup, "startup", deadline=True)
        for running in list(self._running):
            if running.plan.readiness is not None:
                await self._await_probe(running, running.plan.readiness, "readiness", deadline=False)

    async def _spawn(self, container: ContainerPlan) -> _Running:
        self.log(f"starting {container.role} {container.name}: {' '.join(container.argv)}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *container.argv,
                env=container.env,
                cwd=container.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the pod, which stops containers in order
            )
        except OSError as exc:
            raise DeployError(
                f"container {container.name!r} cannot start {container.argv[0]!r}: {exc}"
            ) from None
        assert proc.stdout is not None
        running = _Running(container, proc, asyncio.create_task(self._pump(container.name, proc.stdout)))
        self._running.append(running)
        return running

    async def _pump(self, name: str, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.out.write(f"[{name}] {line.decode('utf-8', errors='replace').rstrip()}\n")
            self.out.flush()

    async def _until(self, awaitable: Any, running: _Running | None = None) -> Any:
        """Await `awaitable` unless a stop is requested first (then raise `_Stopped`)."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.create_task(self.stop_requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise _Stopped
        return task.result()

    async def _await_probe(self, running: _Running, probe: Probe, kind: str, *, deadline: bool) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if probe.initial_delay:
            await self._until(asyncio.sleep(probe.initial_delay))
        successes = 0
        last = "not probed yet"
        next_report = start + 10
        while True:
            if running.proc.returncode is not None:
                raise DeployError(
                    f"container {running.plan.name!r} exited with {running.proc.returncode} "
                    f"before its {kind} probe ({probe.describe()}) passed"
                )
            reason = await self._until(probe_once(probe, running.plan.env))
            if reason is None:
                successes += 1
                if successes >= probe.success_threshold:
                    return
            else:
                successes, last = 0, reason
            now = loop.time()
            if deadline and now - start > probe.budget:
                raise DeployError(
                    f"container {running.plan.name!r}: {kind} probe ({probe.describe()}) still failing "
                    f"after {probe.budget:g}s: {last}"
                )
            if now > next_report:
                self.log(f"waiting for {running.plan.name} {kind} ({probe.describe()}): {last}")
                next_report = now + 10
            await self._until(asyncio.sleep(min(probe.period, POLL_SECONDS)))

    async def _watch(self) -> str | None:
        """Wait for a stop request (None) or for a container to exit (why the pod failed)."""
        exits = {asyncio.ensure_future(r.proc.wait()): r for r in self._running}
        stop = asyncio.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait({stop, *exits}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, *exits):
            if task not in done:
                task.cancel()
        for task in done:
            if task in exits:
                running = exits[task]
                return f"container {running.plan.name!r} exited with {running.proc.returncode}"
        return None

    async def _stop(self) -> dict[str, int]:
        """Main containers first (preStop, SIGTERM), then sidecars in reverse start order."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.plan.grace
        codes: dict[str, int] = {}
        mains = [r for r in self._running if r.plan.role == "main"]
        sidecars = [r for r in self._running if r.plan.role != "main"]
        await asyncio.gather(*(self._pre_stop(r, deadline) for r in mains))
        results = await asyncio.gather(*(self._terminate(r, deadline) for r in mains))
        codes.update(zip((r.plan.name for r in mains), results, strict=True))
        for running in reversed(sidecars):
            codes[running.plan.name] = await self._terminate(running, deadline)
        self._running.clear()
        return codes

    async def _pre_stop(self, running: _Running, deadline: float) -> None:
        if not running.plan.pre_stop or running.proc.returncode is not None:
            return
        loop = asyncio.get_running_loop()
        hook = await asyncio.create_subprocess_exec(
            *running.plan.pre_stop, env=running.plan.env, stdin=asyncio.subprocess.DEVNULL
        )
        try:
            await asyncio.wait_for(hook.wait(), max(deadline - loop.time(), 0.1))
        except TimeoutError:
            hook.kill()
            await hook.wait()

    async def _terminate(self, running: _Running, deadline: float) -> int:
        loop = asyncio.get_running_loop()
        proc = running.proc
        if proc.returncode is None:
            self.log(f"stopping {running.plan.role} {running.plan.name}")
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), max(deadline - loop.time(), 0.1))
            except TimeoutError:
                self.log(f"{running.plan.name} did not stop within the grace period: killed")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        await running.pump
        code = proc.returncode
        assert code is not None
        self.log(f"{running.plan.role} {running.plan.name} exited with {code}")
        return code
