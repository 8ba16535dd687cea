"""What the decision-record tests share (test_decision_record.py records decisions,
test_replay.py replays them): the demo model's config pieces their agents are built from, and the
operator's and a tenant's headers."""

from __future__ import annotations

from typing import Any

OPERATOR = {"Authorization": "Bearer op-key"}
ADA = {"Authorization": "Bearer ada-key"}
WEATHER_TOOL = {
    "description": "The weather in a city.",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
    "result": {"celsius": 21, "forecast": "sunny"},
}
"""The tool the demo model calls when a prompt asks for the weather."""

DEMO_AGENT = {"model": "demo", "errorProcessorDefaults": False}
"""An agent's start: the demo model, without the default error processors (whose decisions would
join the record)."""


def jailbreak_guard() -> dict[str, Any]:
    """A blocking guard (the examples sidecar's) that aborts a run whose input says "jailbreak";
    a fresh dict each time, so that a config naming it twice dumps to YAML without aliases."""
    return {"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}
