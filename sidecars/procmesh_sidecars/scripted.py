"""Scripted processors: the conformance scenarios' rule language, served like any processor.

A scenario's PROCESSOR (``{"id", "processDataParts", "speculative", "processInput": [RULE...],
...}``) becomes a `Processor` implementing exactly the hooks it lists; ``"speculative": true``
declares it speculative (its rules depend only on input and state, so it is). See
``../shared/conformance/FORMAT.md`` for the rules, conditions and actions.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Awaitable, Callable
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

    async def run(
        self, context: Callable[[], dict[str, Any]], act: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        """Run the rules in order: each `when` is judged on `context()` as the earlier rules' actions
        left it (a counter rule 1 increments is visible to rule 2), then its actions run in order."""
        for rule in self.rules:
            if self.holds(rule.get("when") or {}, context()):
                for action in rule.get("do") or []:
                    await act(action)


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
        messages, systems, changed_m, changed_s = kw["messages"], kw["system_messages"], False, False
        result: dict[str, Any] = {}

        async def act(action: dict[str, Any]) -> None:
            nonlocal messages, systems, changed_m, changed_s
            if await self._common(action, kw):
                return
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

        await self.script[name].run(lambda: {**kw, "text": _text_of_messages(messages)}, act)
        if changed_m:
            result["messages"] = messages
        if changed_s:
            result["system_messages"] = systems
        return result or None

    return hook


def _effects_only(name: str) -> Any:
    """A hook whose rules may only use the common actions (abort, count, custom)."""

    async def hook(self: ScriptedProcessor, **kw: Any) -> Any:
        async def act(action: dict[str, Any]) -> None:
            if not await self._common(action, kw):
                raise ValueError(f"action {sorted(action)} is not valid in {name}")

        text = kw["text"] if name == "processOutputStep" else None
        await self.script[name].run(lambda: {**kw, "text": text}, act)
        return None

    return hook


async def _llm_request(self: ScriptedProcessor, **kw: Any) -> Any:
    prompt = kw["prompt"]
    changed = False

    async def act(action: dict[str, Any]) -> None:
        nonlocal prompt, changed
        if await self._common(action, kw):
            return
        if "replaceText" not in action:
            raise ValueError(f"action {sorted(action)} is not valid in processLLMRequest")
        spec = action["replaceText"]
        prompt = copy.deepcopy(prompt)
        for msg in prompt:
            if msg["role"] != "system":
                for part in msg["content"]:
                    if part.get("type") == "text":
                        part["text"] = replace_literal(spec["pattern"], spec["with"], part["text"])
        changed = True

    await self.script["processLLMRequest"].run(lambda: {**kw, "text": _text_of_prompt(prompt)}, act)
    return {"prompt": prompt} if changed else None


async def _output_stream(self: ScriptedProcessor, **kw: Any) -> Any:
    part = kw["part"]
    dropped = False

    def context() -> dict[str, Any]:
        text = part["payload"].get("text") if part["type"] == "text-delta" else None
        return {**kw, "part": part, "text": text}

    async def act(action: dict[str, Any]) -> None:
        nonlocal part, dropped
        if await self._common(action, kw):
            return
        if "drop" in action:
            dropped = True
        elif "replaceText" in action and part["type"] == "text-delta":
            spec = action["replaceText"]
            text = replace_literal(spec["pattern"], spec["with"], part["payload"]["text"])
            part = {**part, "payload": {**part["payload"], "text": text}}
        elif "replaceText" not in action:
            raise ValueError(f"action {sorted(action)} is not valid in processOutputStream")

    await self.script["processOutputStream"].run(context, act)
    return None if dropped else part


async def _tool_result(self: ScriptedProcessor, **kw: Any) -> Any:
    text = json.dumps(kw["result"], separators=(",", ":"), ensure_ascii=False)
    new_result: Any = None

    async def act(action: dict[str, Any]) -> None:
        nonlocal new_result
        if await self._common(action, kw):
            return
        if "setResult" not in action:
            raise ValueError(f"action {sorted(action)} is not valid in processToolResult")
        new_result = action["setResult"]

    await self.script["processToolResult"].run(lambda: {**kw, "retry_count": 0, "text": text}, act)
    return new_result


async def _output_result(self: ScriptedProcessor, **kw: Any) -> Any:
    messages = kw["messages"]
    changed = False

    async def act(action: dict[str, Any]) -> None:
        nonlocal messages, changed
        if await self._common(action, kw):
            return
        if "replaceText" in action:
            spec = action["replaceText"]
            messages = _rewrite_messages(messages, spec["pattern"], spec["with"], roles=("assistant",))
        elif "metadata" in action:
            messages = copy.deepcopy(messages)
            for msg in messages:
                if msg["role"] == "assistant":
                    meta = msg["content"].get("metadata") or {}
                    msg["content"]["metadata"] = {**meta, **action["metadata"]}
        else:
            raise ValueError(f"action {sorted(action)} is not valid in processOutputResult")
        changed = True

    await self.script["processOutputResult"].run(lambda: {**kw, "text": kw["result"]["text"]}, act)
    return messages if changed else None


async def _api_error(self: ScriptedProcessor, **kw: Any) -> Any:
    retry = False

    async def act(action: dict[str, Any]) -> None:
        nonlocal retry
        if await self._common(action, kw):
            return
        if not action.get("retry"):
            raise ValueError(f"action {sorted(action)} is not valid in processAPIError")
        retry = True

    await self.script["processAPIError"].run(lambda: {**kw, "text": kw["error"]["message"]}, act)
    return {"retry": True} if retry else None


_IMPLEMENTATIONS = {
    "processInput": _input_hook("processInput"),
    "processInputStep": _input_hook("processInputStep"),
    "processLLMRequest": _llm_request,
    "processLLMResponse": _effects_only("processLLMResponse"),
    "processOutputStream": _output_stream,
    "processOutputStep": _effects_only("processOutputStep"),
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
        "speculative": bool(spec.get("speculative", False)),
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
    """Every scripted processor a scenario declares (agent and every call's lanes), once per id."""
    specs: dict[str, dict[str, Any]] = {}
    calls: list[dict[str, Any]] = scenario.get("calls") or [scenario.get("call") or {}]
    sources = [scenario.get("agent") or {}, *((c.get("options") or {}) for c in calls)]
    for source in sources:
        for spec in _lane_specs(source):
            if spec["id"] in specs and specs[spec["id"]] != spec:
                raise ValueError(f"two different scripted processors share the id {spec['id']!r}")
            specs[spec["id"]] = spec
    return [build_processor(s) for s in specs.values()]


def _lane_specs(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The processor specs of an agent's or a call's lanes, those of every case and default of a
    lane chosen from the request context (``inputProcessorsByContext``) included."""
    out = [
        spec
        for lane in ("inputProcessors", "outputProcessors", "errorProcessors")
        for spec in source.get(lane) or []
    ]
    for lane in ("inputProcessorsByContext", "outputProcessorsByContext"):
        chosen = source.get(lane) or {}
        for specs in (*(chosen.get("cases") or {}).values(), chosen.get("default") or []):
            out.extend(specs)
    return out
