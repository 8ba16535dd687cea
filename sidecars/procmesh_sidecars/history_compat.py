"""`provider-history-compat`: the reference's history compatibility rules, and your own, as data.

The reference's rules are functions (``applyToPrompt``, ``fix``), which cannot cross to a sidecar.
Here a rule is data: which models it is for (`CompatRule.model`), which rejections turn it on
(`CompatRule.error_patterns`) and the edits it makes to the outgoing prompt (`strip_reasoning`,
`strip_foreign_provider_tools`, `tool_ids`, `replace`). The built-in rules are written in that
same language (`BUILTIN_RULES`), so what your ``additional_rules`` can say is exactly what the
built-ins say. docs/builtins.md maps each of the reference's rules to its form here.

Every edit is transient: it changes the prompt of one provider call, never the stored history.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, model_validator

from procmesh import Processor
from procmesh_sidecars.builtins._linear_re import Pattern, PatternError, compile_pattern

PromptMessage = dict[str, Any]

_PENDING = "pendingRules"
"""State: the rules that are not applied to this call's prompt but would change it."""
_TRIGGERED = "triggeredRules"
"""State: the rules a matching rejection turned on for the rest of the run."""


def _compile(pattern: str, what: str, *, ignore_case: bool = False) -> Pattern:
    try:
        return compile_pattern(pattern, ignore_case=ignore_case)
    except PatternError as exc:
        raise ValueError(f"{what} {pattern!r} is not a regular expression RE2 accepts: {exc}") from None


class TextReplace(BaseModel):
    """A rewrite of the prompt's text: every match of `pattern` is replaced."""

    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1)
    """A regular expression (RE2: no backreferences, no lookaround), case-sensitive."""
    replacement: str
    """The replacement; ``\\1`` or ``\\g<name>`` insert a group."""
    roles: list[Literal["system", "user", "assistant"]] = Field(default=["system", "user"], min_length=1)
    """The messages whose text is rewritten (text parts; a system message's content)."""


class ToolIdRewrite(BaseModel):
    """Tool-call ids a provider rejects, rewritten in calls and their results alike."""

    model_config = ConfigDict(extra="forbid")

    invalid: str = Field(min_length=1)
    """A regular expression matching the characters the provider refuses (``[^a-zA-Z0-9_-]``)."""
    replacement: str = "_"
    """What each match becomes (taken literally)."""


_ANY_EDIT: list[JsonValue] = [
    {
        "required": ["strip_reasoning"],
        "properties": {"strip_reasoning": {"enum": [True, "foreign", "foreign-signed"]}},
    },
    {
        "required": ["strip_foreign_provider_tools"],
        "properties": {"strip_foreign_provider_tools": {"const": True}},
    },
    {"required": ["tool_ids"], "properties": {"tool_ids": {"type": "object"}}},
    {"required": ["replace"], "properties": {"replace": {"minItems": 1}}},
]
"""A rule's published schema asks for an edit, so the orchestrator refuses a rule that does nothing."""


def _not_builtin(schema: dict[str, Any]) -> None:
    # Published (at Describe time, when the built-ins exist), so the orchestrator refuses a rule
    # named like a built-in one at start-up.
    schema["not"] = {"enum": list(BUILTIN_NAMES)}


class CompatRule(BaseModel):
    """One compatibility rule: for which models, after which rejections, which prompt edits.

    A rule applies to every call of a model its `model` matches. With `error_patterns`, a
    rejection matching one of them (on the first attempt) turns it on for the rest of the run and
    the call is retried, when the rule would change the prompt: the reactive recovery for a model
    `model` did not recognise. A rule with neither applies to every call.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": _ANY_EDIT})

    name: str = Field(min_length=1, json_schema_extra=_not_builtin)
    """The rule's name (logs, state); unique, and not a built-in rule's."""
    model: str | None = None
    """A regular expression searched in the model reference (``^azure/``), case-insensitive."""
    error_patterns: list[str] = []
    """Regular expressions searched in a rejection's message and body, case-insensitive."""
    strip_reasoning: bool | Literal["foreign", "foreign-signed"] = False
    """Remove reasoning parts from assistant messages (a message left empty is removed): ``true``
    every one; ``foreign`` all but those the call's model's provider signed; ``foreign-signed``
    those another provider signed."""
    strip_foreign_provider_tools: bool = False
    """Remove the tool calls another provider executed itself (``providerExecuted``), and their
    results: the call's model cannot replay them."""
    tool_ids: ToolIdRewrite | None = None
    """Rewrite the tool-call ids this describes."""
    replace: list[TextReplace] = []
    """Rewrite text, in order."""

    _model: Pattern | None = PrivateAttr(default=None)
    _errors: list[Pattern] = PrivateAttr(default_factory=list)
    _invalid_id: Pattern | None = PrivateAttr(default=None)
    _replace: list[tuple[TextReplace, Pattern]] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _compiled(self) -> CompatRule:
        if not (self.strip_reasoning or self.strip_foreign_provider_tools or self.tool_ids or self.replace):
            raise ValueError(
                f"rule {self.name!r} makes no edit: give strip_reasoning, strip_foreign_provider_tools, "
                "tool_ids or replace"
            )
        if self.model is not None:
            self._model = _compile(self.model, "model", ignore_case=True)
        self._errors = [_compile(p, "error pattern", ignore_case=True) for p in self.error_patterns]
        if self.tool_ids is not None:
            self._invalid_id = _compile(self.tool_ids.invalid, "tool_ids.invalid")
        self._replace = [(r, _compile(r.pattern, "replace pattern")) for r in self.replace]
        return self

    def for_model(self, model: str) -> bool:
        """Whether the rule applies to `model`'s calls before any rejection."""
        if self._model is not None:
            return self._model.search(model) is not None
        return not self._errors

    def matches(self, error: dict[str, Any]) -> bool:
        """Whether `error` (its message or its body) is a rejection this rule repairs."""
        texts = [str(error.get(key) or "") for key in ("message", "body")]
        return any(p.search(text) for p in self._errors for text in texts if text)

    def apply(self, prompt: list[PromptMessage], model: str) -> list[PromptMessage] | None:
        """The prompt of a call to `model` with this rule's edits, or None when they change nothing."""
        out = prompt
        if self.strip_foreign_provider_tools:
            out = _strip_foreign_provider_tools(out, provider_family(model))
        if self.strip_reasoning:
            out = _strip_reasoning(out, self.strip_reasoning, provider_family(model))
        if self._invalid_id is not None and self.tool_ids is not None:
            out = _rewrite_tool_ids(out, self._invalid_id, self.tool_ids.replacement)
        for spec, pattern in self._replace:
            out = _replace_text(out, pattern, spec)
        return out if out != prompt else None


_FAMILIES = (
    ("anthropic", re.compile(r"^anthropic[/:]|claude", re.IGNORECASE)),
    ("openai", re.compile(r"^(openai|azure(-openai)?)[/:]|(^|/)(gpt-|o\d)", re.IGNORECASE)),
    ("google", re.compile(r"^(google|vertex|gemini)[/:]|gemini", re.IGNORECASE)),
)


def provider_family(model: str) -> str:
    """The provider family of a model reference, matched as loosely as the reference matches
    (``anthropic/...``, ``...claude...``, ``azure/gpt-5``); else the reference's provider prefix."""
    for family, pattern in _FAMILIES:
        if pattern.search(model):
            return family
    return re.split(r"[/:]", model, maxsplit=1)[0].lower()


def _foreign(part: dict[str, Any], family: str) -> bool:
    return provider_family(str(part.get("provider") or "")) != family


def _drops_reasoning(part: dict[str, Any], how: bool | str, family: str) -> bool:
    if part.get("type") != "reasoning":
        return False
    if how == "foreign":  # keep only what this provider signed itself
        return not part.get("signature") or _foreign(part, family)
    if how == "foreign-signed":
        return bool(part.get("signature")) and _foreign(part, family)
    return True


def _strip_reasoning(prompt: list[PromptMessage], how: bool | str, family: str) -> list[PromptMessage]:
    out = []
    for msg in prompt:
        content = msg.get("content")
        if msg.get("role") == "assistant" and isinstance(content, list):
            kept = [p for p in content if not _drops_reasoning(p, how, family)]
            if len(kept) != len(content):
                if kept:  # an assistant turn of reasoning only is dropped: providers refuse it empty
                    out.append({**msg, "content": kept})
                continue
        out.append(msg)
    return out


def _strip_foreign_provider_tools(prompt: list[PromptMessage], family: str) -> list[PromptMessage]:
    foreign = {
        p.get("toolCallId")
        for msg in prompt
        if isinstance(msg.get("content"), list)
        for p in msg["content"]
        if p.get("type") == "tool-call" and p.get("providerExecuted") and _foreign(p, family)
    }
    if not foreign:
        return prompt
    out = []
    for msg in prompt:
        content = msg.get("content")
        if isinstance(content, list):
            kept = [
                p
                for p in content
                if not (p.get("type") in ("tool-call", "tool-result") and p.get("toolCallId") in foreign)
            ]
            if len(kept) != len(content):
                if kept:  # a turn of those calls only goes: providers refuse an empty one
                    out.append({**msg, "content": kept})
                continue
        out.append(msg)
    return out


def _rewrite_tool_ids(prompt: list[PromptMessage], invalid: Pattern, replacement: str) -> list[PromptMessage]:
    def new_id(call_id: str) -> str:
        return invalid.sub(lambda _: replacement, call_id)

    out = []
    for msg in prompt:
        content = msg.get("content")
        if isinstance(content, list) and any(p.get("toolCallId") for p in content):
            content = [
                {**p, "toolCallId": new_id(p["toolCallId"])} if p.get("toolCallId") else p for p in content
            ]
            msg = {**msg, "content": content}
        out.append(msg)
    return out


def _replace_text(prompt: list[PromptMessage], pattern: Pattern, spec: TextReplace) -> list[PromptMessage]:
    out = []
    for msg in prompt:
        content = msg.get("content")
        if msg.get("role") not in spec.roles:
            out.append(msg)
            continue
        if isinstance(content, str):
            msg = {**msg, "content": pattern.sub(spec.replacement, content)}
        elif isinstance(content, list):
            content = [
                {**p, "text": pattern.sub(spec.replacement, p["text"])}
                if p.get("type") == "text" and isinstance(p.get("text"), str)
                else p
                for p in content
            ]
            msg = {**msg, "content": content}
        out.append(msg)
    return out


_ANTHROPIC = r"^anthropic[/:]|claude"

BUILTIN_RULES: tuple[CompatRule, ...] = (
    # A tool another provider ran on its side (a web search, code execution) cannot be replayed to
    # this one: the call and its result are dropped, for every model.
    CompatRule(name="strip-foreign-provider-executed-tools", strip_foreign_provider_tools=True),
    # Anthropic enforces ^[a-zA-Z0-9_-]+$ on tool ids; ids from other providers ("call:1/x") are
    # rewritten for a recognised Anthropic model, and after the rejection for one behind a gateway.
    CompatRule(
        name="anthropic-tool-id-format",
        model=_ANTHROPIC,
        error_patterns=[
            r"tool_use\.id.*should match pattern",
            r"tool_use_id.*should match pattern",
            r"tool_call_id.*invalid",
        ],
        tool_ids=ToolIdRewrite(invalid=r"[^a-zA-Z0-9_-]"),
    ),
    # Cerebras rejects assistant messages carrying reasoning (`reasoning_content`).
    CompatRule(name="cerebras-strip-reasoning-content", model=r"^cerebras[/:]", strip_reasoning=True),
    # Anthropic takes back only its own signed thinking: reasoning another provider produced, or
    # that carries no signature, is dropped ...
    CompatRule(name="anthropic-strip-foreign-reasoning-content", model=_ANTHROPIC, strip_reasoning="foreign"),
    # ... and above all reasoning another provider signed (its signature would fail Anthropic's check).
    CompatRule(
        name="anthropic-strip-foreign-signed-reasoning", model=_ANTHROPIC, strip_reasoning="foreign-signed"
    ),
    # Azure's content filter takes <system-reminder> wrappers (signals, reminders) for prompt
    # injection; the model reads the same wrapper as <memory-context>.
    CompatRule(
        name="azure-system-reminder-transform",
        model=r"^azure(-openai)?[/:]",
        replace=[
            TextReplace(pattern=r"<(/?)system-reminder(\s[^>]*|/)?>", replacement=r"<\1memory-context\2>")
        ],
    ),
)
"""The reference's rules this platform's prompts can need, in the reference's order."""
BUILTIN_NAMES = tuple(rule.name for rule in BUILTIN_RULES)


class ProviderHistoryCompatOptions(BaseModel):
    """Options of `provider-history-compat`."""

    model_config = ConfigDict(extra="forbid")

    additional_rules: list[CompatRule] = []
    """Your rules, applied after the built-in ones, in order (the reference's ``additionalRules``)."""

    @model_validator(mode="after")
    def _unique_names(self) -> ProviderHistoryCompatOptions:
        names = [rule.name for rule in self.additional_rules]
        clashes = sorted({n for n in names if names.count(n) > 1 or n in BUILTIN_NAMES})
        if clashes:
            raise ValueError(f"additional_rules: names used twice or by a built-in rule: {clashes}")
        return self


class ProviderHistoryCompat(Processor):
    """Rewrites provider-incompatible history in the outgoing prompt; recovers reactively.

    Each call's prompt gets the edits of every rule for its model (the built-in rules, then
    `additional_rules`), in order; the stored history is untouched. When a provider rejects a call
    with an error a rule's `error_patterns` match, and that rule would change the prompt, the rule
    is turned on for the rest of the run and the call retried once.
    """

    id = "provider-history-compat"
    description = "Fixes provider-specific history incompatibilities in the outgoing prompt (rules as data)."
    Options = ProviderHistoryCompatOptions

    async def process_llm_request(
        self,
        prompt: list[PromptMessage],
        model: str,
        state: dict[str, Any],
        options: ProviderHistoryCompatOptions,
    ) -> dict[str, Any] | None:
        triggered = set(state.get(_TRIGGERED) or ())
        pending = []
        out = prompt
        for rule in (*BUILTIN_RULES, *options.additional_rules):
            edited = rule.apply(out, model)
            if edited is None:
                continue
            if rule.for_model(model) or rule.name in triggered:
                out = edited
            elif rule.error_patterns:
                pending.append(rule.name)
        state[_PENDING] = pending
        return {"prompt": out} if out is not prompt else None

    async def process_api_error(
        self,
        error: dict[str, Any],
        retry_count: int,
        state: dict[str, Any],
        options: ProviderHistoryCompatOptions,
    ) -> dict[str, Any] | None:
        if retry_count > 0:
            return None
        pending = set(state.get(_PENDING) or ())
        for rule in (*BUILTIN_RULES, *options.additional_rules):
            if rule.name in pending and rule.matches(error):
                state[_TRIGGERED] = [*(state.get(_TRIGGERED) or ()), rule.name]
                state[_PENDING] = []
                return {"retry": True}
        return None
