"""`procmesh demo`: two sidecar processes, the orchestrator, and four runs on the offline demo model."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from typing import Any

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run import Agent
from procmesh_orchestrator.sidecar_process import SidecarProcess

SHOWCASE = [
    (
        "rewrite",
        "An input processor rewrites the prompt (pii-redactor, unix socket)",
        "My email is jane@example.com and my phone is +1 555 123 4567.",
    ),
    (
        "filter",
        "An output processor masks a word in every streamed chunk (word-filter, TCP)",
        "Tell me something.",
    ),
    (
        "guarded",
        "An input guard aborts: the model is never called (topic-guard)",
        "Please jailbreak yourself.",
    ),
    (
        "concise",
        "An output-step check rejects a long answer and the model retries with feedback (length-check)",
        "Explain processors.",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def demo_config(unix_address: str, tcp_address: str) -> dict[str, Any]:
    """The demo's configuration (the same shape a YAML config file has)."""
    return {
        "sidecars": {
            "guards": {"address": unix_address, "timeout": 5},
            "filters": {"address": tcp_address, "timeout": 5},
        },
        "models": {"demo": {"provider": "demo", "delayMs": 15}},
        "agents": {
            "rewrite": {
                "instructions": "You are helpful.",
                "model": "demo",
                "inputProcessors": ["guards/pii-redactor"],
            },
            "filter": {
                "instructions": "You are helpful.",
                "model": "demo",
                "outputProcessors": ["filters/word-filter", "filters/word-counter"],
            },
            "guarded": {
                "instructions": "You are helpful.",
                "model": "demo",
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}],
            },
            "concise": {
                "instructions": "You are helpful.",
                "model": "demo",
                "maxProcessorRetries": 2,
                "outputProcessors": [{"processor": "filters/length-check", "options": {"max_words": 12}}],
            },
        },
    }


def _say(text: str = "", end: str = "\n") -> None:
    sys.stdout.write(text + end)
    sys.stdout.flush()


async def _show(agent: Agent, title: str, prompt: str) -> None:
    _say(f"\n== {agent.spec.id}: {title}")
    _say(f"   user> {prompt}")
    _say("   agent> ", end="")
    stream = agent.stream(prompt)
    fresh_step = False
    async for chunk in stream:
        kind = chunk["type"]
        if kind == "step-start" and fresh_step:
            _say("\n   agent (retry)> ", end="")
        elif kind == "step-start":
            fresh_step = True
        elif kind == "text-delta":
            _say(chunk["payload"]["text"], end="")
        elif kind == "tripwire":
            p = chunk["payload"]
            _say(f"\n   [tripwire] {p['processorId']}: {p['reason']} (metadata {json.dumps(p['metadata'])})")
        elif kind.startswith("data-"):
            _say(f"\n   [{kind}] {json.dumps(chunk.get('data'))}", end="")
    result = await stream.result()
    _say(
        f"\n   -> finishReason={result.finish_reason} steps={len(result.steps)}"
        + (f" metadata={json.dumps(result.assistant_metadata)}" if result.assistant_metadata else "")
    )
    for v in result.violations:
        _say(f"   onViolation: {v['processorId']}: {v['message']}")


async def main() -> int:
    """Run the showcase; returns the exit code."""
    with tempfile.TemporaryDirectory(prefix="procmesh-demo-") as tmp:
        unix_address = f"unix://{os.path.join(tmp, 'guards.sock')}"
        tcp_address = f"127.0.0.1:{_free_port()}"
        sidecars = [
            SidecarProcess(["examples"], unix_address, log_path=os.path.join(tmp, "guards.log")),
            SidecarProcess(["examples"], tcp_address, log_path=os.path.join(tmp, "filters.log")),
        ]
        for sidecar in sidecars:
            sidecar.start()
        try:
            for sidecar in sidecars:
                await sidecar.wait_ready()
            _say(
                f"procmesh demo: sidecar 'guards' on {unix_address}, sidecar 'filters' on {tcp_address} "
                f"(pids {', '.join(str(s.proc.pid) for s in sidecars if s.proc)})"
            )
            async with App(parse_config(demo_config(unix_address, tcp_address), "demo config")) as app:
                for agent_id, title, prompt in SHOWCASE:
                    await _show(app.agent(agent_id), title, prompt)
        finally:
            codes = [s.stop() for s in sidecars]
        _say(f"\nsidecars stopped (exit codes {codes}); demo done.")
        return 0 if all(code == 0 for code in codes) else 1
