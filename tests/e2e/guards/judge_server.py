"""A scripted judge: a real OpenAI-compatible server whose verdicts depend on what it is asked.

It is the providers' fake (``tests/integration/providers/fakes.py``: real sockets, the real wire
format, every request recorded, API key checked) with one addition: a judge model answers by
rules over the prompt instead of in call order, since guards judge several texts concurrently.
A rule gives the verdict for a prompt (all messages' text) containing every one of its markers;
the first matching rule wins, else the model's default. A verdict is a JSON value (sent as the
answer's text) or a raw string (a malformed answer); ``delay`` seconds pause before answering.

A merged judge call (several guards' sections in one prompt: the gateway's ``## Check "<name>"``
parts) is answered section by section, each by the same rules over that section's part and the
content, as the guard's call alone would be; a raw-string verdict makes only its section malformed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from tests.integration.providers.fakes import FakeOpenAI, Recorded, Reply


@dataclass(frozen=True)
class Rule:
    markers: tuple[str, ...]
    verdict: Any
    delay: float = 0.0


def prompt_text(body: dict[str, Any]) -> str:
    """Every message's text in a chat-completions body, joined."""
    out = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if p.get("type") == "text"]
    return "\n".join(out)


_CHECK = re.compile(r'^## Check "(?P<name>[^"]+)"\n', re.MULTILINE)


def sections(body: dict[str, Any]) -> dict[str, str]:
    """A merged call's sections: each check's name and its part of the system prompt ({} if alone).

    A section is answered by the rules over its part and every message but the system prompt
    (the content, a retry's complaint)."""
    system = "\n".join(str(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "system")
    marks = list(_CHECK.finditer(system))
    ends = [m.start() for m in marks[1:]] + [len(system)] if marks else []
    return {m["name"]: system[m.end() : end] for m, end in zip(marks, ends, strict=True)}


def judged_content(body: dict[str, Any]) -> str:
    """The text a guard asked about: the last user message's text."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return str(content or "")


class JudgeServer(FakeOpenAI):
    """``POST /v1/chat/completions``: judge models answer by rule; other models by script."""

    def __init__(self, api_key: str | None = None) -> None:
        super().__init__(api_key)
        self._rules: dict[str, list[Rule]] = {}
        self._defaults: dict[str, Rule] = {}
        self._in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        """The most calls of each model that were being answered at once."""
        self.answered: list[str] = []
        """The contents judged so far, each added as its verdict is sent."""
        self._judge_lock = threading.Lock()

    def judge(self, model: str, default: Any, *rules: Rule, delay: float = 0.0) -> None:
        """Make `model` a judge: `rules` in order, else `default`."""
        with self._judge_lock:
            self._rules[model] = list(rules)
            self._defaults[model] = Rule((), default, delay)

    def judged(self, model: str) -> list[str]:
        """The contents `model` was asked to judge, in arrival order."""
        return [judged_content(r.body) for r in self.calls(model)]

    def respond(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        model = str(body.get("model", ""))
        with self._judge_lock:
            default = self._defaults.get(model)
            rules = self._rules.get(model, [])
        if default is None:
            return super().respond(path, headers, body)
        rejected = self.check(headers, body)
        with self._lock:
            self.requests.append(Recorded(path, headers, body))
        if rejected is not None:
            return rejected
        parts = sections(body)
        spoken = prompt_text(
            {"messages": [m for m in body.get("messages") or [] if m.get("role") != "system"]}
        )
        asked = {name: f"{part}\n{spoken}" for name, part in parts.items()} or {"": prompt_text(body)}
        chosen = {
            name: next((r for r in rules if all(m in text for m in r.markers)), default)
            for name, text in asked.items()
        }
        with self._judge_lock:
            self._in_flight[model] = self._in_flight.get(model, 0) + 1
            self.max_in_flight[model] = max(self.max_in_flight.get(model, 0), self._in_flight[model])
        try:
            delay = max(r.delay for r in chosen.values())
            if delay:
                time.sleep(delay)  # this request's own handler thread
        finally:
            with self._judge_lock:
                self._in_flight[model] -= 1
        with self._judge_lock:
            self.answered.append(judged_content(body))
        if not parts:
            verdict = chosen[""].verdict
            return {"text": verdict if isinstance(verdict, str) else json.dumps(verdict)}
        return {"text": json.dumps({name: rule.verdict for name, rule in chosen.items()})}
