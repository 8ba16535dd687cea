"""A call's ``modelSettings.maxRetries`` (the reference's call setting) replaces its provider's
``maxRetries`` for that call's model calls (issue 30 item 4), against the fake OpenAI API."""

from __future__ import annotations

import pytest

from tests.integration.providers.conftest import OPENAI_KEY_ENV
from tests.integration.providers.fakes import FakeOpenAI, error
from tests.integration.providers.helpers import MakeModel, drain, failure, request, text_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

FLAKY = (error(500, "boom", "server_error"), error(429, "slow down", "rate_limit_exceeded"), {"text": "fine"})


@pytest.mark.parametrize(("provider_retries", "call_retries", "calls"), [(0, 2, 3), (2, 0, 1), (0, None, 1)])
async def test_a_calls_max_retries_replaces_the_providers(
    openai_api: FakeOpenAI, make_model: MakeModel, provider_retries: int, call_retries: int | None, calls: int
) -> None:
    openai_api.reset()
    openai_api.script("m", *FLAKY)
    model = make_model(
        openai_api,
        "m",
        kind="openai",
        maxRetries=provider_retries,
        retryBackoffMs=1,
        apiKeyEnv=OPENAI_KEY_ENV,
    )
    settings = {} if call_retries is None else {"maxRetries": call_retries}
    if calls == 3:
        assert text_of(await drain(model, request(model_settings=settings))) == "fine"
    else:
        await failure(model, request(model_settings=settings))
    assert len(openai_api.calls("m")) == calls
    assert "maxRetries" not in openai_api.calls("m")[0].body  # a setting of procmesh's, not the API's
