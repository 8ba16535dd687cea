"""The orchestrator runs one pipeline across three languages: Go, Python and Node sidecars.

Real processes: the Go example (examples/go: word-guard, shout), the Python SDK examples
(`python -m procmesh_sidecars examples`) and the Node SDK examples (`sdk/node/examples/serve.mjs`).
The input lane mixes a Go guard and a Python redactor; the output stream passes Node, Go, Python
and Node again, each stage seeing what the previous one emitted; the Go processors' aborts, from
a unary hook and from the stream, end the run with a tripwire.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import RunResult
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import NODE_SDK
from tests.e2e.go.conftest import go_sidecar
from tests.e2e.node.conftest import node_sidecar, require_node, wait_all

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@dataclass(frozen=True)
class Mesh:
    """The three sidecars' addresses."""

    go: str
    python: str
    node: str


@pytest.fixture(scope="module")
def mesh(go_binary: Path, socket_dir: Path) -> Iterator[Mesh]:
    require_node()
    procs = [
        go_sidecar(go_binary, f"unix://{socket_dir / 'mesh-go.sock'}", socket_dir / "mesh-go.log"),
        SidecarProcess(
            ["examples"], f"unix://{socket_dir / 'mesh-py.sock'}", log_path=str(socket_dir / "mesh-py.log")
        ),
        node_sidecar(
            NODE_SDK / "examples" / "serve.mjs",
            f"unix://{socket_dir / 'mesh-node.sock'}",
            socket_dir / "mesh-node.log",
        ),
    ]
    procs[1].start()
    try:
        wait_all(procs)
        yield Mesh(*(p.address for p in procs))
    finally:
        for proc in procs:
            proc.stop(grace=2.0)


def config(mesh: Mesh, responses: list[dict[str, Any]], *, inputs: list[Any], outputs: list[Any]) -> Config:
    return parse_config(
        {
            "sidecars": {
                "go": {"address": mesh.go},
                "py": {"address": mesh.python},
                "node": {"address": mesh.node},
            },
            "models": {"scripted": {"provider": "scripted", "responses": responses}},
            "agents": {
                "a": {
                    "model": "scripted",
                    # no default error processors: App would start its built-in sidecar per test
                    "errorProcessorDefaults": False,
                    "inputProcessors": inputs,
                    "outputProcessors": outputs,
                }
            },
        },
        "three-language test config",
    )


async def stream(app: App, text: str) -> tuple[list[dict[str, Any]], RunResult]:
    run = app.agent("a").stream(text)
    chunks = [chunk async for chunk in run]
    return chunks, await run.result()


def model_requests(app: App) -> list[Any]:
    model = app.models["scripted"]
    assert isinstance(model, ScriptedModel)
    return list(model.requests)


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


GUARD = {"processor": "go/word-guard", "options": {"words": ["jailbreak"]}}


async def test_a_stream_passes_node_go_python_and_node_processors_in_lane_order(mesh: Mesh) -> None:
    deltas = ["Well, ", "darn ", "it: ", "the secret code ", "is safe ", "now"]
    cfg = config(
        mesh,
        [{"deltas": deltas}],
        inputs=[GUARD, "py/pii-redactor"],
        outputs=[
            {"processor": "node/stream-filter", "options": {"words": ["darn"], "drop": ["secret"]}},
            "go/shout",
            {"processor": "py/word-filter", "options": {"words": ["well"]}},
            "node/word-counter",
        ],
    )
    async with App(cfg) as app:
        assert set(app.catalog["go"]) == {"word-guard", "shout"}
        chunks, result = await stream(app, "Mail me at ana@example.com")
        sent = model_requests(app)
    # Go's guard let the input through; Python's redactor then rewrote it.
    assert "[email]" in str(sent[0].prompt)
    # Node masked "darn" and dropped the "secret" delta, Go upper-cased the rest, and Python's
    # case-insensitive filter masked "WELL": each stage saw the previous one's output.
    assert streamed_text(chunks) == "****, **** IT: IS SAFE NOW"
    assert result.text == "****, **** IT: IS SAFE NOW"
    # The Node counter, last, counted what Go and Python emitted.
    assert [c["data"] for c in chunks if c["type"] == "data-word-count"] == [{"words": 6}]
    assert result.tripwire is None


async def test_the_go_guard_aborts_the_run_before_the_model_or_any_other_processor(mesh: Mesh) -> None:
    cfg = config(
        mesh,
        [{"text": "never"}],
        inputs=[GUARD, "py/pii-redactor"],
        outputs=["go/shout", "node/word-counter"],
    )
    async with App(cfg) as app:
        chunks, result = await stream(app, "please JAILBREAK this")
        assert model_requests(app) == []
    assert [c["type"] for c in chunks if c["type"] != "start"] == ["tripwire"]
    assert result.tripwire is not None
    assert result.tripwire["processorId"] == "word-guard"
    assert result.tripwire["reason"] == "blocked word: jailbreak"
    assert result.tripwire["metadata"] == {"word": "jailbreak"}


async def test_a_go_stream_abort_ends_the_run_with_nothing_emitted_after_it(mesh: Mesh) -> None:
    cfg = config(
        mesh,
        [{"deltas": ["All ", "is ", "fine, ", "then ", "a secret ", "leaks"]}],
        inputs=[],
        outputs=[{"processor": "go/shout", "options": {"abortOn": ["secret"]}}, "py/word-filter"],
    )
    async with App(cfg) as app:
        chunks, result = await stream(app, "go on")
    assert streamed_text(chunks) == "ALL IS FINE, THEN "
    assert chunks[-1]["type"] == "tripwire"
    assert result.tripwire is not None
    assert result.tripwire["processorId"] == "shout"
    assert result.tripwire["reason"] == "shout will not say: secret"
    assert result.finish_reason == "other"
