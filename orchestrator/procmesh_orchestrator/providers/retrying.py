"""`RetryingModel`: an agent's model with its own retries (``model: [{model, maxRetries}]``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from procmesh_orchestrator.providers._base import HTTPModel
from procmesh_orchestrator.providers._http import RetryPolicy, with_retries
from procmesh_orchestrator.run.models import (
    Chunk,
    ModelProvider,
    ModelRequest,
    setting_warnings,
    specification_version,
)


class RetryingModel:
    """`model`, its retryable failures before the first chunk retried `max_retries` times (the
    provider's backoff and Retry-After rules), before the error processors and the next model."""

    def __init__(self, model: ModelProvider, max_retries: int) -> None:
        self.model = model
        self.model_id = model.model_id
        self.specification_version = specification_version(model)
        # an HTTP model's provider sets the first backoff (retryBackoffMs); built-in models: 500 ms
        backoff = model.connection.config.retry_backoff_ms if isinstance(model, HTTPModel) else 500.0
        self._policy = RetryPolicy(max_retries=max_retries, backoff_ms=backoff)

    def unsupported_settings(self, model_settings: dict[str, Any]) -> list[str]:
        """The model's (`run.models.setting_warnings`)."""
        return [w["setting"] for w in setting_warnings(self.model, model_settings)]

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream the model's answer, retried as the policy allows."""
        return with_retries(lambda: _generator(self.model, request), self._policy, what=self.model_id)


async def _generator(model: ModelProvider, request: ModelRequest) -> AsyncGenerator[Chunk, None]:
    async for chunk in model.stream(request):
        yield chunk
