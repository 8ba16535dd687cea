"""unicode-normalizer through a real `procmesh-sidecar unicode-normalizer` process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import make_config, prompt_texts, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "unicode-normalizer")


@pytest.mark.parametrize(
    ("options", "text", "expected"),
    [
        ({}, "  \uff46\uff55\uff4c\uff4c\u3000width  \ufb01  \r\n\r\n\tdone  ", "full width fi \n done"),
        ({"strip_control_chars": True}, "bell\x07 and\x1b esc 😀", "bell and esc 😀"),
        ({"strip_control_chars": True, "preserve_emojis": False}, "nul\x00 ok 😀\x9f", "nul ok 😀"),
        ({"collapse_whitespace": False, "trim": False}, " a  \n\n b ", " a  \n\n b "),
    ],
)
async def test_input_is_normalized(address: str, options: dict, text: str, expected: str) -> None:
    cfg = make_config(address, input_processors=[ref("unicode-normalizer", **options)])
    out = await run(cfg, text)
    assert prompt_texts(out.requests[0])[-1] == expected
