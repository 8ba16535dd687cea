"""The reference's LLM-judged guards: moderation, prompt injection, PII, language, system-prompt scrubber.

Each guard asks a judge model through the orchestrator's model gateway (the hook's ``model``
argument: the sidecar holds no provider key) for a verdict as JSON matching a schema, and applies
the reference's strategies with the reference's option names and defaults. Streamed answers are
judged per window, not per chunk (`_windows`, `_judge`). docs/builtins.md, "LLM-judged guards",
has each guard's options and a runnable configuration.
"""

from __future__ import annotations

from procmesh import Processor
from procmesh_sidecars.builtins.guards.language import LanguageDetector
from procmesh_sidecars.builtins.guards.moderation import Moderation
from procmesh_sidecars.builtins.guards.pii import PIIDetector
from procmesh_sidecars.builtins.guards.prompt_injection import PromptInjectionDetector
from procmesh_sidecars.builtins.guards.system_prompt import SystemPromptScrubber

GUARDS: dict[str, type[Processor]] = {
    cls.id: cls
    for cls in (Moderation, PromptInjectionDetector, PIIDetector, LanguageDetector, SystemPromptScrubber)
}
"""The five guards by processor id (each is also a ``procmesh-sidecar`` set of that name)."""


def processors() -> list[Processor]:
    """One instance of every guard."""
    return [cls() for cls in GUARDS.values()]
