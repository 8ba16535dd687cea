"""Scripted processors: the conformance scenarios' rule language, served like any processor.

A scenario's PROCESSOR (``{"id", "processDataParts", "processInput": [RULE...], ...}``)
becomes a `Processor` implementing exactly the hooks it lists. See
``../shared/conformance/FORMAT.md`` for the rules, conditions and actions.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from procmesh import Processor, hooks

_STEP_HOOKS = {
    "processInputStep",
    "processLLMRequest",
    "processLLMResponse",
    "processOutputStep",
    "processToolResult",
    "processAPIError",
}


def replace_literal(pattern: str, replacement: str, text: str) -> str:
    """Replace every match of `pattern`; the replacement is inserted literally (no group references)."""
    return re.sub(pattern, lambda _m: replacement, text)


def _text_of_messages(messages: list[dict[str, Any]]) -> str:
    texts: list[str] = []
    for msg in messages:
        if msg.get("role") == "system":
            continue
        texts.extend(p.get("text", "") for p in msg["content"].get("parts", []) if p.get("type") == "text")
    return "\n".join(texts)


def _text_of_prompt(prompt: list[dict[str, Any]]) -> str:
    texts: list[str] = []
    for msg in prompt:
        if msg["role"] == "system":
            continue
        texts.extend(p.get("text", "") for p in msg["content"] if p.get("type") == "text")
    return "\n".join(texts)


def _rewrite_messages(
    messages: list[dict[str, Any]], pattern: str, replacement: str, roles: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    out = []
    for msg in messages:
        msg = copy.deepcopy(msg)
        if msg.get("role") != "system" and (roles is None or msg.get("role") in roles):
            for part in msg["content"].get("parts", []):
                if part.get("type") == "text":
                    part["text"] = replace_literal(pattern, replacement, part["text"])
        out.append(msg)
    return out


class _Script:
    """Evaluates one hook's rules against what the hook was given."""

    def __init__(self, hook: str, rules: list[dict[str, Any]]) -> None:
        self.hook = hook
        self.rules = rules

    def holds(self, cond: dict[str, Any], ctx: dict[str, Any]) -> bool:
        text = ctx.get("text")
        for key, want in cond.items():
            if key == "textContains":
                ok = text is not None and want in text
            elif key == "textMatches":
                ok = text is not None and re.search(want, text) is not None
            elif key == "stepNumber":
                ok = self.hook in _STEP_HOOKS and ctx["step_number"] == want
            elif key == "stepNumberGte":
                ok = self.hook in _STEP_HOOKS and ctx["step_number"] >= want
            elif key == "retryCountLt":
                ok = ctx["retry_count"] < want
            elif key == "partType":
                ok = self.hook == "processOutputStream" and ctx["part"]["type"] == want
            elif key == "stateGte":
                ok = ctx["state"].get(want["key"], 0) >= want["value"]
            elif key == "errorStatus":
                ok = self.hook == "processAPIError" and ctx["error"]["status"] == want
            else:
                raise ValueError(f"unknown condition {key!r}")
            if not ok:
                return False
        return True

    def matching(self, ctx: dict[str, Any]) -> list[dict[str, Any]]:
        actions: list[dict[str, Any]] = []
        for rule in self.rules:
            if self.holds(rule.get("when") or {}, ctx):
                actions.extend(rule.get("do") or [])
        return actions


class ScriptedProcessor(Processor):
    """Base of the classes `build_processor` makes; hooks are added per scenario."""

    script: dict[str, _Script]

    async def _abort(self, action: dict[str, Any], abort: Any) -> None:
        spec = action["abort"]
        kwargs: dict[str, Any] = {}
        if "retry" in spec:
            kwargs["retry"] = spec["retry"]
        if "metadata" in spec:
            kwargs["metadata"] = spec["metadata"]
        abort(spec.get("reason"), **kwargs)

    async def _custom(self, action: dict[str, Any], state: dict[str, Any], writer: Any) -> None:
        spec = action["custom"]
        if "dataFromState" in spec:
            key = spec["dataFromState"]
            data = {key: state.get(key, 0)}
        else:
            data = spec.get("data")
        await writer.custom({"type": spec["type"], "data": data})

    async def _common(self, action: dict[str, Any], kw: dict[str, Any]) -> bool:
        """Actions valid in several hooks; True when handled."""
        if "abort" in action:
            await self._abort(action, kw["abort"])
        elif "count" in action:
            kw["state"][action["count"]] = kw["state"].get(action["count"], 0) + 1
        elif "custom" in action:
            await self._custom(action, kw["state"], kw["writer"])
        else:
            return False
        return True


def _input_hook(name: str) -> Any:
    async def hook(self: ScriptedProcessor, **kw: Any) -> Any:
        script = self.script[name]
        actions = script.matching({**kw, "text": _text_of_messages(kw["messages"])})
        messages, systems, changed_m, changed_s = kw["messages"], kw["system_messages"], False, False
        result: dict[str, Any] = {}
        for action in actions:
            if await self._common(action, kw):
                continue
            if "replaceText" in action:
                spec = action["replaceText"]
                messages = _rewrite_messages(messages, spec["pattern"], spec["with"])
                changed_m = True
            elif "systemMessage" in action:
                systems = [
                    *systems,
                    {
                        "id": f"sys-{len(systems)}-{self.id}",
                        "role": "system",
                        "content": {
                            "format": 2,
                            "parts": [{"type": "text", "text": action["systemMessage"]}],
                        },
                    },
                ]
                changed_s = True
            elif "signal" in action and name == "processInputStep":
                spec = action["signal"]
                signal = {"type": "reactive", "contents": spec["contents"]}
                for key in ("attributes", "transient"):
                    if key in spec:
                        signal[key] = spec[key]
                await kw["send_signal"](signal)
            elif "toolChoice" in action and name == "processInputStep":
                result["tool_choice"] = action["toolChoice"]
            else:
                raise ValueError(f"action {sorted(action)} is not valid in {name}")
        if changed_m:
            result["messages"] = messages
        if changed_s:
            result["system_messages"] = systems
        return result or None

    return hook


async def _llm_request(self: ScriptedProcessor, **kw: Any) -> Any:
    script = self.script["processLLMRequest"]
    prompt = kw["prompt"]
    changed = False
    for action in script.matching({**kw, "text": _text_of_prompt(prompt)}):
        if await self._common(action, kw):
            continue
        if "replaceText" in action:
            spec = action["replaceText"]
            prompt = copy.deepcopy(prompt)
            for msg in prompt:
                if msg["role"] != "system":
                    for part in msg["content"]:
                        if part.get("type") == "text":
                            part["text"] = replace_literal(spec["pattern"], spec["with"], part["text"])
            changed = True
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processLLMRequest")
    return {"prompt": prompt} if changed else None


async def _llm_response(self: ScriptedProcessor, **kw: Any) -> Any:
    for action in self.script["processLLMResponse"].matching({**kw, "text": None}):
        if not await self._common(action, kw):
            raise ValueError(f"action {sorted(action)} is not valid in processLLMResponse")
    return None


async def _output_stream(self: ScriptedProcessor, **kw: Any) -> Any:
    part = kw["part"]
    text = part["payload"].get("text") if part["type"] == "text-delta" else None
    for action in self.script["processOutputStream"].matching({**kw, "text": text}):
        if await self._common(action, kw):
            continue
        if "drop" in action:
            return None
        if "replaceText" in action and part["type"] == "text-delta":
            spec = action["replaceText"]
            part = {
                **part,
                "payload": {
                    **part["payload"],
                    "text": replace_literal(spec["pattern"], spec["with"], part["payload"]["text"]),
                },
            }
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processOutputStream")
    return part


async def _output_step(self: ScriptedProcessor, **kw: Any) -> Any:
    for action in self.script["processOutputStep"].matching({**kw, "text": kw["text"]}):
        if not await self._common(action, kw):
            raise ValueError(f"action {sorted(action)} is not valid in processOutputStep")
    return None


async def _tool_result(self: ScriptedProcessor, **kw: Any) -> Any:
    text = json.dumps(kw["result"], separators=(",", ":"), ensure_ascii=False)
    new_result: Any = None
    for action in self.script["processToolResult"].matching({**kw, "retry_count": 0, "text": text}):
        if await self._common(action, kw):
            continue
        if "setResult" in action:
            new_result = action["setResult"]
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processToolResult")
    return new_result


async def _output_result(self: ScriptedProcessor, **kw: Any) -> Any:
    messages = kw["messages"]
    changed = False
    for action in self.script["processOutputResult"].matching({**kw, "text": kw["result"]["text"]}):
        if await self._common(action, kw):
            continue
        if "replaceText" in action:
            spec = action["replaceText"]
            messages = _rewrite_messages(messages, spec["pattern"], spec["with"], roles=("assistant",))
            changed = True
        elif "metadata" in action:
            messages = copy.deepcopy(messages)
            for msg in messages:
                if msg["role"] == "assistant":
                    meta = msg["content"].get("metadata") or {}
                    msg["content"]["metadata"] = {**meta, **action["metadata"]}
            changed = True
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processOutputResult")
    return messages if changed else None


async def _api_error(self: ScriptedProcessor, **kw: Any) -> Any:
    retry = False
    for action in self.script["processAPIError"].matching({**kw, "text": kw["error"]["message"]}):
        if await self._common(action, kw):
            continue
        if action.get("retry"):
            retry = True
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processAPIError")
    return {"retry": True} if retry else None


_IMPLEMENTATIONS = {
    "processInput": _input_hook("processInput"),
    "processInputStep": _input_hook("processInputStep"),
    "processLLMRequest": _llm_request,
    "processLLMResponse": _llm_response,
    "processOutputStream": _output_stream,
    "processOutputStep": _output_step,
    "processToolResult": _tool_result,
    "processOutputResult": _output_result,
    "processAPIError": _api_error,
}


def scenario_key(hook: hooks.Hook) -> str:
    """A hook's key in a scenario's PROCESSOR: the seeds' camelCase name (``processLLMRequest``)."""
    return hook.rpc[0].lower() + hook.rpc[1:]


HOOKS: dict[str, str] = {
    scenario_key(hook): hook.name for hook in hooks.HOOKS if scenario_key(hook) in _IMPLEMENTATIONS
}
"""Scenario key -> Processor method, for the hooks the rule language scripts (all but executeTool)."""


def build_processor(spec: dict[str, Any]) -> Processor:
    """A processor implementing exactly the hooks `spec` lists."""
    attrs: dict[str, Any] = {
        "id": spec["id"],
        "process_data_parts": bool(spec.get("processDataParts", False)),
        "script": {},
    }
    for key, method in HOOKS.items():
        if key in spec:
            attrs["script"][key] = _Script(key, spec[key])
            attrs[method] = _IMPLEMENTATIONS[key]
    cls = type(f"Scripted_{re.sub(r'[^A-Za-z0-9_]', '_', spec['id'])}", (ScriptedProcessor,), attrs)
    processor: Processor = cls()
    return processor


def scenario_processors(scenario: dict[str, Any]) -> list[Processor]:
    """Every scripted processor a scenario declares (agent and call lanes), once per id."""
    specs: dict[str, dict[str, Any]] = {}
    sources = [scenario.get("agent") or {}, (scenario.get("call") or {}).get("options") or {}]
    for source in sources:
        for lane in ("inputProcessors", "outputProcessors", "errorProcessors"):
            for spec in source.get(lane) or []:
                if spec["id"] in specs and specs[spec["id"]] != spec:
                    raise ValueError(f"two different scripted processors share the id {spec['id']!r}")
                specs[spec["id"]] = spec
    return [build_processor(s) for s in specs.values()]
