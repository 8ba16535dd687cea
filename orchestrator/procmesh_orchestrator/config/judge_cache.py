"""The configuration's ``judgeCache`` section: the model gateway's cache of judge verdicts.

A verdict is the judge model's typed answer to one question (the judged text in the guard's
prompt, its instructions and schema, the judge model); the gateway keeps it in this process (a
bounded LRU with a TTL) and, with ``redis``, in Redis too, so replicas share it. Off by default:
a cached verdict is reused for the TTL even when the judge model would now answer otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.errors import ConfigError


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class JudgeCacheRedis(_Model):
    """Where replicas share verdicts: the URL forms of ``durable.eventLog`` (``redis://``,
    ``rediss://``, ``unix://``), given in the file or in an environment variable."""

    url: str | None = None
    url_env: str | None = None
    """The environment variable holding the URL (a password stays out of the file)."""
    key_prefix: str = "procmesh:verdict:"
    timeout: float = Field(default=0.5, gt=0)
    """Seconds a Redis command may take; a slower or failing Redis is a miss, never a failed call."""

    @model_validator(mode="after")
    def _where(self) -> JudgeCacheRedis:
        if not (self.url or self.url_env):
            raise ValueError("give url or urlEnv")
        return self

    def redis_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The URL, from `url` or the variable `url_env` names; a `ConfigError` when neither gives one."""
        env = os.environ if environ is None else environ
        value = env.get(self.url_env, "") if self.url_env else (self.url or "")
        if not value:
            where = (
                f"the environment variable {self.url_env} is not set"
                if self.url_env
                else "give url or urlEnv"
            )
            raise ConfigError(f"judgeCache.redis: {where}")
        return value


class JudgeCacheConfig(_Model):
    """The ``judgeCache`` section."""

    enabled: bool = False
    max_entries: int = Field(default=10_000, ge=1)
    """Verdicts kept in this process (the least recently used go first)."""
    ttl_seconds: float = Field(default=600.0, gt=0)
    """How long a verdict is reused, in this process and in Redis."""
    redis: JudgeCacheRedis | None = None
