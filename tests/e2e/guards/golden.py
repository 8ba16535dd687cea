"""The golden set's runs: each labelled window through each guard alone and through the five
together, on a real orchestrator (HTTP API) whose built-in sidecar hosts the guards, judged by
`golden_judge.GoldenJudge`; and the decisions read back from each run.

A guard's decision is ``block`` (the run's tripwire names it), ``redact`` (it reported a
violation without blocking: with the options below only PII and the scrubber do, when they
redact) or ``allow``. Together, the guards of a lane commit in lane order, so a guard behind the
first one that blocks is never reached: only the reached guards are compared. Where no guard
blocks, the text that reaches the model (input) or the client (output) must also be the same as
the one redacting guard alone made it. The golden-set e2e test and bench P8 share this.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

INPUT_LANE = ["prompt-injection-detector", "moderation", "language-detector", "pii-detector"]
"""The input guards together, in lane order (PII last: a redaction changes what later guards see)."""
OUTPUT_LANE = ["moderation", "system-prompt-scrubber", "pii-detector"]
"""The output guards together, in lane order."""
OPTIONS: dict[str, dict[str, Any]] = {
    "moderation": {},
    "prompt-injection-detector": {},
    "pii-detector": {},
    "language-detector": {"strategy": "block"},
    "system-prompt-scrubber": {},
}
"""Each guard's options beside the judge model: the defaults (block; PII and scrubber redact),
language blocking what is not English."""
_ECHO = 'You said: "'


def guard(pid: str, judge: str) -> dict[str, Any]:
    """A built-in guard (the orchestrator starts the built-in sidecar) judged by `judge`."""
    return {"processor": f"builtins/{pid}", "options": {"model": judge, **OPTIONS[pid]}}


def lanes(judge: str) -> dict[str, Any]:
    """The five guards together: both lanes."""
    return {
        "inputProcessors": [guard(g, judge) for g in INPUT_LANE],
        "outputProcessors": [guard(g, judge) for g in OUTPUT_LANE],
    }


def config(windows: list[dict[str, Any]], judge: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The models and agents the golden runs use: ``golden-<guard>`` / ``golden-all`` on the echoing
    demo model for input windows; per output window a scripted model streaming its text word by
    word, with ``golden-<guard>@<id>`` / ``golden-all@<id>``. The guards alone ask `judge`, together
    ``<judge>-together`` (the judge answers both alike), so a verdict cache keyed by the judge
    model never hands the five together what a guard alone was told: together is judged afresh."""
    base = {"errorProcessorDefaults": False}
    together = f"{judge}-together"  # its own judge model: no verdict cached for a guard alone is reused
    models: dict[str, Any] = {"golden-echo": {"provider": "demo"}}
    agents: dict[str, Any] = {"golden-all": {**base, "model": "golden-echo", **lanes(together)}}
    for g in INPUT_LANE:
        agents[f"golden-{g}"] = {**base, "model": "golden-echo", "inputProcessors": [guard(g, judge)]}
    for w in windows:
        if w["phase"] != "output":
            continue
        model = f"golden-{w['id']}"
        words = w["text"].split(" ")
        deltas = [words[0], *(f" {word}" for word in words[1:])]
        # every run on it gets the same answer, whichever agent asks
        models[model] = {"provider": "scripted", "responses": [{"deltas": deltas}] * 64}
        agents[f"golden-all@{w['id']}"] = {**base, "model": model, **lanes(together)}
        for g in OUTPUT_LANE:
            agents[f"golden-{g}@{w['id']}"] = {**base, "model": model, "outputProcessors": [guard(g, judge)]}
    return models, agents


async def generate(http: httpx.AsyncClient, agent: str, text: str) -> dict[str, Any]:
    response = await http.post(f"/api/agents/{agent}/generate", json={"messages": text})
    if response.status_code != 200:
        raise RuntimeError(f"{agent}: {response.status_code} {response.text}")
    result: dict[str, Any] = response.json()
    return result


def decisions(result: dict[str, Any], phase: str, guards: list[str]) -> dict[str, str]:
    """Each of `guards`' decision on `phase` in a run's result."""
    tripwire = result.get("tripwire") or {}
    blocker = tripwire.get("processorId") if (tripwire.get("metadata") or {}).get("phase") == phase else None
    reported = {
        v.get("processorId")
        for v in result.get("violations") or []
        if (v.get("detail") or {}).get("phase") == phase
    }
    return {g: "block" if g == blocker else "redact" if g in reported else "allow" for g in guards}


def passed_text(result: dict[str, Any], phase: str) -> str | None:
    """What the model was given (input: the demo model echoes it) or what the client got (output)."""
    text = str(result.get("text") or "")
    if phase == "output":
        return text
    if not text.startswith(_ECHO):
        return None
    return text[len(_ECHO) : text.index('" Darn')]


async def judge_window(http: httpx.AsyncClient, window: dict[str, Any]) -> list[str]:
    """Run `window` through each guard alone and the five together; what differs, as sentences:
    a guard alone against its label, and the guards together against each alone."""
    phase, wid = window["phase"], window["id"]
    lane = INPUT_LANE if phase == "input" else OUTPUT_LANE
    text = window["text"] if phase == "input" else "go"
    suffix = "" if phase == "input" else f"@{wid}"
    alone_results = await asyncio.gather(*(generate(http, f"golden-{g}{suffix}", text) for g in lane))
    together = await generate(http, f"golden-all{suffix}", text)
    problems: list[str] = []
    alone = {g: decisions(r, phase, [g])[g] for g, r in zip(lane, alone_results, strict=True)}
    for g in lane:
        if alone[g] != window["labels"][g]:
            problems.append(f"{wid} {g} alone: {alone[g]}, labelled {window['labels'][g]}")
    joint = decisions(together, phase, lane)
    blockers = [g for g in lane if alone[g] == "block"]
    reached = lane[: lane.index(blockers[0]) + 1] if blockers else lane
    for g in reached:
        if joint[g] != alone[g]:
            problems.append(f"{wid} {g} together: {joint[g]}, alone {alone[g]}")
    redactors = [g for g in lane if alone[g] == "redact"]
    if not blockers and len(redactors) <= 1:
        alone_text = passed_text(alone_results[lane.index(redactors[0])], phase) if redactors else text
        if phase == "output" and not redactors:
            alone_text = window["text"]
        if passed_text(together, phase) != alone_text:
            problems.append(f"{wid} together passed {passed_text(together, phase)!r}, alone {alone_text!r}")
    return problems


async def judge_all(
    http: httpx.AsyncClient, windows: list[dict[str, Any]], concurrency: int = 4
) -> list[str]:
    """`judge_window` over every window, `concurrency` at a time; every difference found."""
    gate = asyncio.Semaphore(concurrency)

    async def one(window: dict[str, Any]) -> list[str]:
        async with gate:
            return await judge_window(http, window)

    found = await asyncio.gather(*(one(w) for w in windows))
    return [p for problems in found for p in problems]
