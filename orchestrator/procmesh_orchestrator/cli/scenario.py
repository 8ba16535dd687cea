"""`procmesh scenario run FILE`: run a conformance scenario and build its trace (FORMAT.md).

The scenario's scripted processors are served by a separate sidecar process reached over a
unix socket, as a user's would be: ``procmesh-sidecar scripted`` (Python, the default) or,
with ``--sidecar-runtime node``, ``node $PROCMESH_NODE_SDK/scripted/serve.mjs`` (the Node SDK,
found by configuration: an installed orchestrator has no checkout beside it).

Two flags run the same scenario another way, and its trace must not change: ``--speculate``
makes every scripted processor declare itself speculative (the ``speculative`` script key), so
the orchestrator calls consecutive ones at once and commits in order; ``--fuse`` lets the
orchestrator fuse the processors, which one sidecar serves, into one request per hook (without
it the config turns fusing off, so the default run calls each processor on its own).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from procmesh_orchestrator.app import App
from procmesh_orchestrator.cli import scenario_keys
from procmesh_orchestrator.cli.scenario_keys import LANES as _LANES
from procmesh_orchestrator.cli.scenario_keys import lane_specs
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError, ScenarioError
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions, RunResult, stop
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import MemoryStore

_KEPT_SIGNAL_KEYS = ("type", "tagName", "contents", "attributes", "transient")

SIDECAR_RUNTIMES = ("python", "node")
"""Where a scenario's scripted processors can run: the Python SDK or the Node SDK."""


def node_sdk() -> Path:
    """The Node SDK's folder (``sdk/node`` of a checkout, or an unpacked package): ``$PROCMESH_NODE_SDK``."""
    folder = os.environ.get("PROCMESH_NODE_SDK")
    if not folder:
        raise ScenarioError(
            "the node sidecar runtime needs the Node SDK: set PROCMESH_NODE_SDK to its folder "
            "(sdk/node in a checkout of procmesh)"
        )
    return Path(folder)


def node_command(script: str | Path, *args: str) -> list[str]:
    """``node SCRIPT ARGS...`` for a script of the Node SDK (a path inside `node_sdk()`).

    The binary is ``$PROCMESH_NODE`` or ``node`` on the PATH (Node.js 20 or newer); a clear error
    when Node or the SDK's packages are missing.
    """
    sdk = node_sdk()
    wanted = os.environ.get("PROCMESH_NODE") or "node"
    node = shutil.which(wanted)
    if not node:
        raise ScenarioError(
            f"the node sidecar runtime needs Node.js 20+ ({wanted!r} not found): put `node` on PATH "
            "or set PROCMESH_NODE"
        )
    if not (sdk / "node_modules" / "@grpc" / "grpc-js").is_dir():
        raise ScenarioError(f"the Node SDK's packages are not installed: run `npm ci --prefix {sdk}`")
    return [node, str(sdk / script), *args]


def scripted_sidecar(runtime: str, scenario_path: str, address: str, log_path: str) -> SidecarProcess:
    """The process serving a scenario's scripted processors on `address`, in `runtime`."""
    proc = SidecarProcess(["scripted", "--scenario", scenario_path], address, log_path=log_path)
    if runtime == "node":
        proc.args = node_command("scripted/serve.mjs", "--scenario", scenario_path, "--listen", address)
    elif runtime != "python":
        raise ScenarioError(
            f"unknown sidecar runtime {runtime!r} (choose from {', '.join(SIDECAR_RUNTIMES)})"
        )
    return proc


def scenario_calls(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenario's calls, in order: its `calls`, or its one `call`."""
    calls = scenario.get("calls")
    return list(calls) if isinstance(calls, list) else [scenario["call"]]


def _sources(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects that hold lanes: the agent, then each call's options."""
    return [scenario.get("agent") or {}, *((c.get("options") or {}) for c in scenario_calls(scenario))]


def _has_processors(scenario: dict[str, Any]) -> bool:
    return any(lane_specs(src) for src in _sources(scenario))


def _silent(scenario: dict[str, Any]) -> set[str]:
    """Ids of the processors declared with ``"onViolation": false``: no callback records theirs."""
    return {p["id"] for src in _sources(scenario) for p in lane_specs(src) if p.get("onViolation") is False}


def _threads(scenario: dict[str, Any]) -> list[tuple[str, str]]:
    """Every thread a call names, as ``(thread, resource)`` (thread ids are scoped by resource), in
    order of first use."""
    named = [(c.get("options") or {}).get("memory") or {} for c in scenario_calls(scenario)]
    return list(dict.fromkeys((m["thread"], m.get("resource", "")) for m in named if m.get("thread")))


def speculative_copy(scenario: dict[str, Any]) -> dict[str, Any]:
    """The scenario with every scripted processor declaring ``"speculative": true``."""
    out: dict[str, Any] = copy.deepcopy(scenario)
    for source in _sources(out):
        for spec in lane_specs(source):
            spec["speculative"] = True
    return out


def _config(scenario: dict[str, Any], address: str | None, store_path: str, fuse: bool) -> dict[str, Any]:
    agent = scenario.get("agent") or {}
    tools = scenario.get("tools") or {}
    agent_cfg: dict[str, Any] = {
        "instructions": agent.get("instructions", ""),
        "model": "scripted",
        "tools": list(tools),
    }
    for key in ("maxSteps", "maxProcessorRetries", "errorProcessorDefaults", "stopWhen"):
        if key in agent:
            agent_cfg[key] = agent[key]
    if "memory" in agent:
        agent_cfg["memory"] = {"lastMessages": agent["memory"]["lastMessages"]}
    for lane in _LANES:
        agent_cfg[lane] = [f"scripted/{p['id']}" for p in agent.get(lane) or []]
    for lane in scenario_keys.CONTEXT_LANES:
        if lane in agent:
            chosen = agent[lane]
            agent_cfg[lane.removesuffix("ByContext")] = []
            agent_cfg[lane] = {
                "key": chosen["key"],
                "cases": {
                    value: [f"scripted/{p['id']}" for p in specs]
                    for value, specs in (chosen.get("cases") or {}).items()
                },
                "default": [f"scripted/{p['id']}" for p in chosen.get("default") or []],
            }
    return {
        # the scenario's store lives as long as its run: a SQLite file in the run's temp folder
        "storage": {"backend": "sqlite", "path": store_path},
        "sidecars": {"scripted": {"address": address, "timeout": 30}} if address else {},
        "models": {"scripted": {"provider": "scripted", "responses": scenario.get("model") or []}},
        "tools": {
            name: {
                "description": t.get("description", ""),
                "result": t.get("result"),
                "custom": t.get("custom"),
            }
            for name, t in tools.items()
        },
        "agents": {"scenario": agent_cfg},
        "fuse": fuse,
    }


def _prompt_message(msg: dict[str, Any]) -> dict[str, Any]:
    content = msg["content"]
    if isinstance(content, str):
        return {"role": msg["role"], "text": content}
    texts = [p["text"] for p in content if p.get("type") == "text"]
    out: dict[str, Any] = {"role": msg["role"]}
    if texts and "".join(texts):
        out["text"] = "\n".join(texts)
    calls = [{"name": p["toolName"], "args": p.get("input")} for p in content if p.get("type") == "tool-call"]
    results = [
        {"name": p["toolName"], "result": p.get("output")} for p in content if p.get("type") == "tool-result"
    ]
    if calls:
        out["toolCalls"] = calls
    if results:
        out["toolResults"] = results
    return out


def trace_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chunks as the trace keeps them: text merged per model call, the rest reduced to its fields."""
    out: list[dict[str, Any]] = []
    merge = False
    for chunk in chunks:
        kind = chunk["type"]
        payload = chunk.get("payload") or {}
        if kind == "step-start":
            merge = False
            continue
        if kind == "text-delta":
            if merge and out and out[-1]["type"] == "text":
                out[-1]["text"] += payload.get("text", "")
            else:
                out.append({"type": "text", "text": payload.get("text", "")})
            merge = True
            continue
        merge = False
        if kind == "tool-call":
            out.append({"type": kind, "toolName": payload["toolName"], "args": payload.get("args")})
        elif kind == "tool-result":
            out.append({"type": kind, "toolName": payload["toolName"], "result": payload.get("result")})
        elif kind == "tool-error":
            out.append({"type": kind, "toolName": payload["toolName"], "error": payload.get("error")})
        elif kind.startswith("data-"):
            data = chunk.get("data")
            if kind == "data-signal" and isinstance(data, dict):
                data = {k: data[k] for k in _KEPT_SIGNAL_KEYS if k in data}
            out.append({"type": kind, "data": data})
        elif kind == "tripwire":
            out.append(
                {"type": kind, **{k: payload.get(k) for k in ("processorId", "reason", "retry", "metadata")}}
            )
        elif kind == "finish":
            out.append({"type": kind, "finishReason": payload.get("finishReason")})
        elif kind == "error":
            out.append({"type": kind, "message": payload.get("message")})
    return out


def _result(result: RunResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "finishReason": result.finish_reason,
        "steps": len(result.steps),
        "tripwire": result.tripwire,
        "assistantMetadata": result.assistant_metadata,
    }


async def run_scenario(
    scenario: dict[str, Any],
    scenario_path: str,
    *,
    sidecar_runtime: str = "python",
    speculate: bool = False,
    fuse: bool = False,
) -> dict[str, Any]:
    """Run one scenario end to end and return its trace.

    `sidecar_runtime` picks the SDK serving the scripted processors (`SIDECAR_RUNTIMES`);
    `speculate` and `fuse` are the command's ``--speculate`` and ``--fuse`` (module docstring).
    """
    with tempfile.TemporaryDirectory(prefix="procmesh-scenario-") as tmp:
        sidecar = None
        address = None
        if _has_processors(scenario):
            address = f"unix://{os.path.join(tmp, 'scripted.sock')}"
            if speculate:
                # the sidecar reads its script from a file: give it the speculative copy
                scenario_path = os.path.join(tmp, "speculative.json")
                text = json.dumps(speculative_copy(scenario))
                await asyncio.to_thread(Path(scenario_path).write_text, text, "utf-8")
            sidecar = scripted_sidecar(
                sidecar_runtime, scenario_path, address, log_path=os.path.join(tmp, "sidecar.log")
            )
            sidecar.start()
        try:
            if sidecar is not None:
                await sidecar.wait_ready()
            config = parse_config(
                _config(scenario, address, os.path.join(tmp, "memory.db"), fuse), "scenario"
            )
            async with App(config) as app:
                threads = _threads(scenario) if "memory" in (scenario.get("agent") or {}) else None
                silent = _silent(scenario)
                traces = [await _call(app, call, threads, silent) for call in scenario_calls(scenario)]
                return {"calls": traces} if "calls" in scenario else traces[0]
        finally:
            if sidecar is not None:
                sidecar.stop()


async def _call(
    app: App, call: dict[str, Any], threads: list[tuple[str, str]] | None, silent: set[str]
) -> dict[str, Any]:
    """One call of the scenario and its trace (only what this call produced); with memory, the
    `threads` as they stand once the call has ended. Processors in `silent` have no onViolation."""
    agent = app.agent("scenario")
    model = agent.spec.model
    assert isinstance(model, ScriptedModel)
    first_request = len(model.requests)
    opts = call.get("options") or {}
    memory = opts.get("memory") or {}
    violations: list[dict[str, Any]] = []

    def on_violation(v: dict[str, Any]) -> None:
        if v["processorId"] not in silent:
            violations.append({"processorId": v["processorId"], "message": v["message"]})

    options = CallOptions(
        max_steps=opts.get("maxSteps"),
        max_processor_retries=opts.get("maxProcessorRetries"),
        stop_when=stop.parse(opts["stopWhen"], "call.options.stopWhen") if "stopWhen" in opts else None,
        request_context=opts.get("requestContext") or {},
        on_violation=on_violation,
        thread_id=memory.get("thread", ""),
        resource_id=memory.get("resource", ""),
    )
    for lane, attr in zip(_LANES, ("input_processors", "output_processors", "error_processors"), strict=True):
        if lane in opts:
            setattr(options, attr, app.resolve([f"scripted/{p['id']}" for p in opts[lane]], f"call.{lane}"))
    trace: dict[str, Any] = {"chunks": [], "result": None, "violations": violations, "error": None}
    if call.get("method", "generate") == "stream":
        stream = agent.stream(call["input"], options)
        chunks = [chunk async for chunk in stream]
        result = await stream.result()
        trace["chunks"] = trace_chunks(chunks)
        trace["result"] = _result(result)
        trace["error"] = result.error
    else:
        try:
            trace["result"] = _result(await agent.generate(call["input"], options))
        except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
            trace["error"] = str(exc)
    trace["modelCalls"] = [
        {"messages": [_prompt_message(m) for m in req.prompt], "toolChoice": req.tool_choice}
        for req in model.requests[first_request:]
    ]
    if threads is not None:
        assert app.store is not None
        trace.update(await memory_trace(app.store, threads))
    return trace


async def memory_trace(store: MemoryStore, threads: list[tuple[str, str]]) -> dict[str, Any]:
    """The trace's ``memory`` (default recall: signals hidden) and ``memorySignals`` of `threads`
    (``(thread, resource)`` pairs), keyed by thread id, or by ``resource/thread`` for a thread id
    that several resources use (each has its own thread of that id)."""
    recall: dict[str, Any] = {}
    signals: dict[str, Any] = {}
    shared = {t for t, _ in threads if sum(1 for other, _ in threads if other == t) > 1}
    for thread, resource in threads:
        key = f"{resource}/{thread}" if thread in shared else thread
        visible = await store.messages(thread, resource, include_signals=False)
        recall[key] = [_prompt_message(m) for m in msgs.build_prompt([], visible, user_first=False)]
        raw = await store.messages(thread, resource, include_signals=True)
        signals[key] = [msgs.render_signal(m) for m in raw if m.get("role") == "signal"]
    return {"memory": recall, "memorySignals": signals}


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last one without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ScenarioError(f"duplicate key {key!r} in one JSON object")
        out[key] = value
    return out


def load(path: str) -> dict[str, Any]:
    """Read a scenario file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=_no_duplicate_keys)
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"scenario {path} is not valid JSON: {exc}") from None
    except ScenarioError as exc:
        raise ScenarioError(f"scenario {path}: {exc}") from None
    if not isinstance(data, dict) or "model" not in data or ("call" in data) == ("calls" in data):
        raise ScenarioError(f"{path}: a scenario needs a 'model' key and either 'call' or 'calls'")
    try:
        scenario_keys.check(data)
    except ScenarioError as exc:
        raise ScenarioError(f"scenario {path}: {exc}") from None
    return data
