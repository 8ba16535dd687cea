"""Shared helpers for the built-in processors' end-to-end tests.

Each test module starts one real ``procmesh-sidecar <set>`` process (the
`start_sidecar` fixture) and runs agents through `orchestrator.app.App` on the
`scripted` model, as a caller would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions, RunResult
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.sidecar_process import SidecarProcess

SIDECAR = "bi"


async def start(start_sidecar: Callable[..., SidecarProcess], *set_names: str) -> str:
    """Start ``procmesh-sidecar SET...`` and return its address once it is SERVING."""
    proc = start_sidecar(*set_names, name=set_names[0])
    await proc.wait_ready()
    return proc.address


def ref(processor: str, **options: Any) -> dict[str, Any]:
    """A lane entry for a processor of the test sidecar."""
    return {"processor": f"{SIDECAR}/{processor}", "options": options}


def make_config(
    address: str,
    *,
    input_processors: Sequence[Any] = (),
    output_processors: Sequence[Any] = (),
    responses: list[dict[str, Any]] | None = None,
    tools: dict[str, dict[str, Any]] | None = None,
    agent_tools: Sequence[str] | None = None,
    max_steps: int = 5,
    max_processor_retries: int | None = None,
    instructions: str = "You are helpful.",
    extra_agents: dict[str, dict[str, Any]] | None = None,
    delay_ms: float = 0,
) -> Config:
    agent: dict[str, Any] = {
        "model": "scripted",
        "instructions": instructions,
        # no default error processors: App would start its own built-in sidecar per test
        "errorProcessorDefaults": False,
        "maxSteps": max_steps,
        "inputProcessors": list(input_processors),
        "outputProcessors": list(output_processors),
        "tools": list(agent_tools if agent_tools is not None else (tools or {})),
    }
    if max_processor_retries is not None:
        agent["maxProcessorRetries"] = max_processor_retries
    agents = {"a": agent}
    for name, overrides in (extra_agents or {}).items():
        agents[name] = {**agent, **overrides}
    return parse_config(
        {
            "sidecars": {SIDECAR: {"address": address, "timeout": 10}},
            "models": {
                "scripted": {
                    "provider": "scripted",
                    "responses": responses or [{"text": "ok"}],
                    "delayMs": delay_ms,
                }
            },
            "tools": tools or {},
            "agents": agents,
        },
        "test config",
    )


def model_requests(app: App) -> list[ModelRequest]:
    """What the scripted model was asked, in order."""
    model = app.models["scripted"]
    assert isinstance(model, ScriptedModel)
    return model.requests


def prompt_texts(request: ModelRequest) -> list[str]:
    """Every text in a prompt (system strings and text parts), in order."""
    out = []
    for msg in request.prompt:
        content = msg["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out += [p["text"] for p in content if p.get("type") == "text"]
    return out


@dataclass
class Outcome:
    """A finished run: its result, streamed chunks (stream only) and the model's requests."""

    result: RunResult
    chunks: list[dict[str, Any]] = field(default_factory=list)
    requests: list[ModelRequest] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [c["type"] for c in self.chunks]

    def text_deltas(self) -> list[str]:
        return [c["payload"]["text"] for c in self.chunks if c["type"] == "text-delta"]


async def call(
    app: App, text: Any = "hi", *, stream: bool = False, options: CallOptions | None = None, agent: str = "a"
) -> Outcome:
    """One generate() or stream() call on an open App."""
    before = len(model_requests(app))
    if stream:
        handle = app.agent(agent).stream(text, options)
        chunks = [c async for c in handle]
        result = await handle.result()
    else:
        chunks = []
        result = await app.agent(agent).generate(text, options)
    return Outcome(result, chunks, model_requests(app)[before:])


async def run(
    config: Config, text: Any = "hi", *, stream: bool = False, options: CallOptions | None = None
) -> Outcome:
    """One call on a fresh App."""
    async with App(config) as app:
        return await call(app, text, stream=stream, options=options)
