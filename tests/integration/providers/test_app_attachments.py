"""End to end: attachments a model cannot fetch (SEED-GAPS D28-D30) on `App` agents over the HTTP
providers, the default error processors in their real sidecar process.

A real HTTP file server on 127.0.0.1 holds the attachments. Loopback is not a public address, so
only providers whose ``downloadAllowHosts`` names it may download from it; the same URLs through a
provider without the setting are refused (test_download_guard.py refuses every address class).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.providers.conftest import ANTHROPIC_KEY_ENV, OPENAI_KEY_ENV
from tests.integration.providers.fakes import FakeAnthropic, FakeOpenAI
from tests.integration.providers.files import FileServer
from tests.integration.providers.helpers import message, run_keeping_history, text

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.usefixtures("fresh_fakes")]

REPORT = b"Quarterly report: revenue up 4%."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def resign(start_sidecar: Callable[..., SidecarProcess]) -> str:
    """A real sidecar process serving your own error processor (tests/fixtures/resign_sidecar.py)."""
    proc = start_sidecar(name="resign", module="tests.fixtures.resign_sidecar")
    await proc.wait_ready()
    return proc.address


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(
    openai_api: FakeOpenAI,
    anthropic_api: FakeAnthropic,
    tmp_path_factory: pytest.TempPathFactory,
    resign: str,
) -> AsyncIterator[App]:
    local = {"kind": "openai", "baseUrl": openai_api.base_url, "apiKeyEnv": OPENAI_KEY_ENV}
    config = parse_config(
        {
            "storage": {"backend": "sqlite", "path": str(tmp_path_factory.mktemp("memory") / "memory.db")},
            "sidecars": {"own": {"address": resign, "timeout": 10}},
            "providers": {
                "internal": {**local, "downloadAllowHosts": ["127.0.0.1"]},
                "guarded": local,
                "claude": {
                    "kind": "anthropic",
                    "baseUrl": anthropic_api.base_url,
                    "apiKeyEnv": ANTHROPIC_KEY_ENV,
                    "downloadAllowHosts": ["127.0.0.0/8"],
                },
            },
            "agents": {
                "reader": {"model": "internal/reader", "memory": {"lastMessages": 10}},
                "guarded": {"model": "guarded/reader"},
                "claude": {"model": "claude/claude-test"},
                "fallbacks": {"model": [{"model": "internal/first"}, {"model": "internal/second"}]},
                "resigning": {  # your own processor swaps an expired URL for a fresh one
                    "model": "internal/resigning",
                    "errorProcessors": [{"processor": "own/resign-attachments"}],
                },
                "signed": {  # your own instance: a DOWNLOAD_ASSETS_FAILED is worth one more try
                    "model": "internal/signed",
                    "errorProcessors": [
                        {
                            "processor": "builtins/stream-error-retry-processor",
                            "options": {
                                "matchers": [{"error_id": ["DOWNLOAD_ASSETS_FAILED"], "max_retries": 1}]
                            },
                        }
                    ],
                },
            },
        },
        "test config",
    )
    async with App(config) as app:
        yield app


def attachment(url: str, media_type: str = "text/plain", **extra: Any) -> dict[str, Any]:
    return {"type": "file", "mediaType": media_type, "url": url, **extra}


def user_content(recorded: Any) -> list[dict[str, Any]]:
    return recorded.body["messages"][-1]["content"]


async def test_a_file_the_model_cannot_fetch_is_downloaded_and_sent_inline(
    app: App, openai_api: FakeOpenAI, files: FileServer
) -> None:
    files.files["/q3/report.txt"] = [(200, REPORT, "text/plain; charset=utf-8")]
    picture = files.url("/cat.png")  # chat completions fetch image URLs themselves
    question = message(
        "user", text("Summarise."), attachment(files.url("/q3/report.txt")), attachment(picture, "image/png")
    )

    result = await app.agent("reader").generate([question])

    assert result.text == "ok"
    (call,) = openai_api.calls("reader")
    inline = base64.b64encode(REPORT).decode()
    assert user_content(call) == [
        text("Summarise."),
        {"type": "file", "file": {"filename": "file", "file_data": f"data:text/plain;base64,{inline}"}},
        {"type": "image_url", "image_url": {"url": picture}},
    ]
    assert files.hits == {"/q3/report.txt": 1}


async def test_anthropic_fetches_pdfs_itself_and_gets_other_documents_inline(
    app: App, anthropic_api: FakeAnthropic, files: FileServer
) -> None:
    files.files["/notes.txt"] = [(200, REPORT, "text/plain")]
    pdf = files.url("/paper.pdf")  # the Messages API fetches PDF (and image) URLs itself
    question = message(
        "user", text("Compare."), attachment(files.url("/notes.txt")), attachment(pdf, "application/pdf")
    )
    result = await app.agent("claude").generate([question])

    assert result.text == "ok"
    (call,) = anthropic_api.calls("claude-test")
    assert call.body["messages"][-1]["content"][1:] == [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": REPORT.decode()}},
        {"type": "document", "source": {"type": "url", "url": pdf}},
    ]
    assert files.hits == {"/notes.txt": 1}


async def test_a_loopback_url_is_refused_without_the_allow_list(
    app: App, openai_api: FakeOpenAI, files: FileServer
) -> None:
    files.files["/q3/report.txt"] = [(200, REPORT, "text/plain")]
    question = message("user", text("Summarise."), attachment(files.url("/q3/report.txt")))

    result = await app.agent("guarded").generate([question])

    assert files.hits == {}  # never connected
    (call,) = openai_api.calls("reader")  # answered with the placeholder, never with the file
    assert user_content(call) == [text("Summarise."), text("[Attachment unavailable: report.txt]")]
    assert result.text == "ok"


async def test_a_failed_download_reaches_process_api_error_which_may_retry(
    app: App, openai_api: FakeOpenAI, files: FileServer
) -> None:
    # the first GET fails (an expired signed URL), the second works: only processAPIError's retry
    # (the matcher on error_id DOWNLOAD_ASSETS_FAILED) gets the model the file
    files.files["/signed/report.txt"] = [(403, b"expired", "text/plain"), (200, REPORT, "text/plain")]
    url = files.url("/signed/report.txt") + "?sig=secret"
    result = await app.agent("signed").generate([message("user", text("Summarise."), attachment(url))])

    assert result.text == "ok"
    assert files.hits == {"/signed/report.txt": 2}
    (call,) = openai_api.calls("signed")
    assert (
        user_content(call)[1]["file"]["file_data"]
        == "data:text/plain;base64," + base64.b64encode(REPORT).decode()
    )


async def test_your_processor_may_replace_the_attachment_and_retry(
    app: App, openai_api: FakeOpenAI, files: FileServer
) -> None:
    files.files["/fresh/report.txt"] = [(200, REPORT, "text/plain")]  # /expired/ is a 404
    question = message("user", text("Summarise."), attachment(files.url("/expired/report.txt")))
    result, stored = await run_keeping_history(app, "resigning", [question])

    assert result.text == "ok"
    assert files.hits == {"/expired/report.txt": 1, "/fresh/report.txt": 1}
    (call,) = openai_api.calls("resigning")
    assert (
        user_content(call)[1]["file"]["file_data"]
        == "data:text/plain;base64," + base64.b64encode(REPORT).decode()
    )
    assert stored[0]["content"]["parts"][1]["data"] == files.url("/fresh/report.txt")  # its edit stays


async def test_an_unrecoverable_download_is_retried_once_with_a_placeholder(
    app: App, openai_api: FakeOpenAI, files: FileServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = files.url("/gone/minutes.txt")  # 404
    question = message("user", text("What was decided?"), attachment(url, filename="Minutes March.txt"))
    options = CallOptions(thread_id="t-minutes", resource_id="r-1")

    with caplog.at_level(logging.WARNING):
        result, stored = await run_keeping_history(app, "reader", [question], options)

    assert result.text == "ok"
    (call,) = openai_api.calls("reader")  # the failed download never reached the model
    assert user_content(call) == [
        text("What was decided?"),
        text("[Attachment unavailable: Minutes March.txt]"),
    ]
    assert files.hits == {"/gone/minutes.txt": 1}
    assert stored[0]["content"]["parts"] == question["content"]["parts"]  # the thread keeps the file
    assert stored[0]["content"]["metadata"]["mastra"] == {"unavailableAttachments": [url]}
    assert any(
        "Failed to download asset" in r.getMessage() and "placeholder" in r.getMessage()
        for r in caplog.records
    )

    # a later turn of the thread shows the same placeholder without downloading again
    again = await app.agent("reader").generate("And who attended?", options)
    assert again.text == "ok"
    later = openai_api.calls("reader")[-1].body["messages"]
    assert later[0]["content"] == [
        text("What was decided?"),
        text("[Attachment unavailable: Minutes March.txt]"),
    ]
    assert files.hits == {"/gone/minutes.txt": 1}


async def test_the_fallback_model_comes_before_the_placeholder(
    app: App, openai_api: FakeOpenAI, files: FileServer
) -> None:
    question = message("user", text("Summarise."), attachment(files.url("/gone/report.txt")))
    result = await app.agent("fallbacks").generate([question])

    assert result.text == "ok"
    assert files.hits == {"/gone/report.txt": 2}  # the first model's download, then the second's
    assert openai_api.calls("first") == []
    (call,) = openai_api.calls("second")  # the last model answers with the placeholder
    assert user_content(call) == [text("Summarise."), text("[Attachment unavailable: report.txt]")]


async def test_an_undecodable_data_url_is_replaced_at_once(app: App, openai_api: FakeOpenAI) -> None:
    broken = {
        "type": "file",
        "mediaType": "application/pdf",
        "data": "data:application/pdf;base64,%%%not-base64",
    }
    result = await app.agent("reader").generate([message("user", text("Read this."), broken)])

    assert result.text == "ok"
    (call,) = openai_api.calls("reader")  # one call: no failed attempt first
    assert user_content(call) == [text("Read this."), text("[Attachment unavailable: application/pdf]")]
