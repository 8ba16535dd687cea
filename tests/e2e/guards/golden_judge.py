"""A scripted judge for any guard's schema: a real OpenAI-compatible server (the providers' fake,
``tests/integration/providers/fakes.py``) that answers every chat completion with valid verdict
JSON for whatever schema the request carries, after a fixed delay, and counts requests per model.

It knows the five built-in guards by the shape of their verdicts (procmesh's and the reference's
schemas name the same fields), wherever they sit in the schema: a guard's schema alone, or a
merged schema with a section per guard (the guard planner's one judge call per window) get the
same verdict for the same text. The verdict comes from the golden answers
(``tests/fixtures/guard_golden_windows.json``) for the golden text the prompt contains, else the
guard's clean answer (nothing found, English); anything else the schema asks for is filled with
the simplest valid value. The bench's P8 and the golden-set e2e test share it, so procmesh alone,
procmesh planned and the reference all get the same answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.e2e.guards.judge_server import prompt_text
from tests.integration.providers.fakes import FakeOpenAI, Recorded, Reply

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "guard_golden_windows.json"
"""The labelled windows and the judge's answers for them."""

CLEAN: dict[str, dict[str, Any]] = {
    "moderation": {"category_scores": [], "reason": None},
    "prompt-injection-detector": {"categories": [], "reason": None},
    "pii-detector": {"categories": [], "detections": []},
    "language-detector": {"iso_code": "en", "confidence": 0.99},
    "system-prompt-scrubber": {"detections": [], "reason": None},
}
"""Each guard's answer for a text with nothing to report (English)."""


def guard_of(properties: set[str]) -> str | None:
    """Which guard a verdict object is for, from the fields it asks for (None: not a verdict)."""
    if "category_scores" in properties:
        return "moderation"
    if "iso_code" in properties:
        return "language-detector"
    if {"categories", "detections"} <= properties:
        return "pii-detector"
    if "categories" in properties:
        return "prompt-injection-detector"
    if "detections" in properties:
        return "system-prompt-scrubber"
    return None


def load_golden(path: Path = GOLDEN) -> list[dict[str, Any]]:
    """The golden windows: ``{id, phase, text, labels: {guard: decision}, answers: {guard: verdict}}``."""
    windows: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["windows"]
    return windows


def fill(schema: Any, answers: dict[str, Any]) -> Any:
    """A value valid for `schema`: a guard's verdict where the schema asks for one, else the simplest."""
    if not isinstance(schema, dict):
        return None
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        typed = [o for o in options if o.get("type") != "null"]
        return fill(typed[0], answers) if typed and _is_verdict(typed[0]) else None
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        properties: dict[str, Any] = schema.get("properties") or {}
        guard = guard_of(set(properties))
        verdict = answers.get(guard, CLEAN.get(guard or "", {})) if guard else {}
        out = {}
        for name, sub in properties.items():
            out[name] = verdict[name] if name in verdict else fill(sub, answers)
        return out
    return {"array": [], "string": "", "number": 0, "integer": 0, "boolean": False}.get(str(kind))


def _is_verdict(schema: dict[str, Any]) -> bool:
    """Whether a nullable branch holds (or is) a verdict section, which is never left null."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return False
    return guard_of(set(properties)) is not None or any(
        isinstance(s, dict) and _is_verdict(s) for s in properties.values()
    )


class GoldenJudge(FakeOpenAI):
    """``POST /v1/chat/completions`` answered by `fill` for the request's schema, after a delay."""

    def __init__(
        self,
        windows: list[dict[str, Any]],
        delay: float = 0.0,
        api_key: str | None = None,
        delays: dict[str, float] | None = None,
    ) -> None:
        super().__init__(api_key)
        self.delay = delay
        self.delays = dict(delays or {})
        """Per judge model, instead of `delay` (a model only counted or checked need not wait)."""
        self._answers = {w["text"]: w["answers"] for w in windows}
        # longest first: a golden text inside a longer one never takes its answers
        self._texts = sorted(self._answers, key=len, reverse=True)
        self._counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def start(self) -> GoldenJudge:
        super().start()
        assert self._server is not None
        # a planned lane sends a whole turn's judge calls at once (76 for ten turns' history): the
        # socketserver's backlog of 5 reset the connections beyond it, failing the guards' calls
        self._server.socket.listen(256)
        return self

    def count(self, model: str) -> int:
        """Requests for `model` so far."""
        with self._count_lock:
            return self._counts[model]

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        rejected = self.check(headers, body)
        with self._lock:
            self.requests.append(Recorded(path, headers, body))
        with self._count_lock:
            self._counts[str(body.get("model", ""))] += 1
        if rejected is not None:
            return rejected
        delay = self.delays.get(str(body.get("model", "")), self.delay)
        if delay:
            time.sleep(delay)  # this request's own handler thread
        text = prompt_text(body)
        golden = next((t for t in self._texts if t in text), None)
        answers = self._answers[golden] if golden is not None else {}
        return {"text": json.dumps(fill(schema_of(body), answers))}


def schema_of(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema a chat-completions body asks the answer to match."""
    response_format = body.get("response_format") or {}
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else {}
