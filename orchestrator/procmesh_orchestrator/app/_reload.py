"""Reloading the config without a restart: on SIGHUP, and when the config file's content changes.

A reload reads the file once, validates it as start-up does (the schema, the restart-only keys,
every sidecar answering Describe, every processor hosted, every option valid, the tools and MCP
servers bound) into a new `Pipeline` beside the serving one, then swaps (`App.swap`): new runs
take the new pipeline, runs in flight finish on theirs, and the old one's channels close after
its last run. A config that fails is refused: logged with the reason, counted
(``procmesh_config_reloads_total{outcome="refused"}``), and the last good one keeps serving.

The file is polled by the SHA-256 of its content (its path resolved at each read), so an edit in
place, a rename over it, and Kubernetes' update of a mounted ConfigMap (a swap of the ``..data``
symlink) are all seen.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Literal

from procmesh_orchestrator.app._app import App, secret_variables
from procmesh_orchestrator.app._pipeline import Pipeline
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.config.loading import config_from_text
from procmesh_orchestrator.errors import ConfigError

log = logging.getLogger(__name__)

Outcome = Literal["applied", "unchanged", "refused"]

RESTART_ONLY = {
    "storage": "the store the orchestrator opened at start (its backend and DSN)",
    "durable": "durable runs' event log and lease settings, in use since start",
}
"""The config's top-level keys a reload cannot change, and why. The serving settings (listen
addresses, TLS, API keys, limits: ``PROCMESH_*`` and flags) are not in the file at all."""


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """What in `new` a reload cannot apply over `old`, each naming its key."""
    problems = [
        f"{key}: changed, and it needs a restart ({why})"
        for key, why in RESTART_ONLY.items()
        if getattr(old, key) != getattr(new, key)
    ]
    return problems


def secret_keys(config: Config, names: set[str]) -> list[str]:
    """The keys of `config` that name one of the secret variables `names` (`secret_variables`): a
    provider's ``apiKeyEnv``, the judge cache's Redis ``urlEnv``; ``secrets`` for none of these
    (the store's ``dsnEnv`` and the event log's ``urlEnv`` are refused as restart-only anyway)."""
    keys = [f"providers.{name}.apiKeyEnv" for name, p in config.providers.items() if p.api_key_env in names]
    redis = config.judge_cache.redis
    if redis is not None and redis.url_env in names:
        keys.append("judgeCache.redis.urlEnv")
    return keys or ["secrets"]


class ConfigReloader:
    """Reloads `app`'s config from `path` on request (`reload`, SIGHUP) and when the file changes.

    `poll_seconds` is how often the file's content hash is read (0: never; SIGHUP only).
    `builtins_env_fixed`: the App runs a built-in sidecar whose environment was set at its start,
    so a reload that names a new secret variable (a provider's ``apiKeyEnv``) is refused (the
    sidecar holds that variable).
    """

    def __init__(
        self,
        app: App,
        path: str,
        *,
        poll_seconds: float = 2.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.path = path
        self.poll_seconds = poll_seconds
        self._environ = environ
        self._lock = asyncio.Lock()
        self._seen: str | None = None
        """The content hash of the file as last read (by a reload or at `start`)."""
        self._unreadable: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._requested: set[asyncio.Task[Outcome]] = set()
        self._stopped = False

    def _read(self) -> tuple[str, str]:
        """The file's text and the SHA-256 of its bytes (OSError when it cannot be read)."""
        with open(os.path.realpath(self.path), "rb") as f:
            data = f.read()
        return data.decode("utf-8", errors="replace"), hashlib.sha256(data).hexdigest()

    def start(self) -> None:
        """Note the file's content as serving, and start polling it (unless `poll_seconds` is 0)."""
        try:
            self._seen = self._read()[1]
        except OSError as exc:
            log.warning("config file %s cannot be read (%s): polling waits for it", self.path, exc.strerror)
        if self.poll_seconds > 0:
            self._task = asyncio.create_task(self._poll())

    def request(self, reason: str = "SIGHUP") -> None:
        """Reload in the background (a signal handler's call); reloads never overlap."""
        if self._stopped:
            log.info("%s while stopping: no reload", reason)
            return
        task = asyncio.get_running_loop().create_task(self.reload(reason))
        self._requested.add(task)
        task.add_done_callback(self._requested.discard)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                digest = self._read()[1]
            except OSError as exc:  # a ConfigMap mid-update, or a file being replaced
                if self._unreadable != exc.strerror:
                    log.warning(
                        "config file %s cannot be read (%s): still serving the last good config",
                        self.path,
                        exc.strerror,
                    )
                    self._unreadable = exc.strerror
                continue
            self._unreadable = None
            if digest != self._seen:
                await self.reload("config file changed")

    async def reload(self, reason: str = "SIGHUP") -> Outcome:
        """Load, validate and swap in the file's config; the outcome, counted and logged."""
        async with self._lock:
            outcome = await self._reload(reason)
        self.app.metrics.config_reloads.labels(outcome).inc()
        return outcome

    async def _reload(self, reason: str) -> Outcome:
        app = self.app
        try:
            try:
                text, self._seen = self._read()
            except OSError as exc:
                raise ConfigError(f"cannot read config {self.path}: {exc.strerror}") from None
            config = config_from_text(text, self.path, self._environ)
            pipeline = Pipeline(
                config,
                app.metrics,
                connect_timeout=app.connect_timeout,
                lanes=app.lanes,
                ended=app.ended,
                failed=app.failed,
                began=app.began,
                started=app.started,
            )
            if pipeline.version == app.version:
                log.info("config reload (%s): version %s unchanged, nothing to swap", reason, app.version)
                return "unchanged"
            problems = restart_only_changes(app.config, config)
            if app.builtins is not None:
                new = sorted(secret_variables(config) - secret_variables(app.config))
                if new:
                    problems.append(
                        f"{', '.join(secret_keys(config, set(new)))}: names the secret variable(s) "
                        f"{', '.join(new)}, which the built-in sidecar started with this orchestrator "
                        "holds in its environment; a restart starts it without them"
                    )
            if problems:
                raise ConfigError("; ".join(problems))
            await app.start_pipeline(pipeline)  # closed again when it fails
        except ConfigError as exc:
            why = " ".join(str(exc).split())  # one log line, the key paths kept
            log.error("config reload (%s) refused, still serving version %s: %s", reason, app.version, why)
            return "refused"
        except Exception:
            log.exception("config reload (%s) failed, still serving version %s", reason, app.version)
            return "refused"
        old = app.swap(pipeline)
        log.info(
            "config reloaded (%s): version %s serves new runs (was %s; %d run(s) in flight finish on it)",
            reason,
            pipeline.version,
            old.version,
            old.runs,
        )
        if any(a.durable for a in config.agents.values()):
            await app.durable_runs()
        return "applied"

    async def stop(self) -> None:
        """Stop polling; a reload under way is cancelled (the serving config stays)."""
        self._stopped = True
        tasks = [*self._requested, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
