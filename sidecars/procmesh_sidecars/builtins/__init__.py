"""The reference engine's deterministic built-in processors, written with the public SDK only.

Each module holds one processor (or a small group) with a pydantic Options model
whose fields are the reference's option names in snake_case. `SETS` maps the
``procmesh-sidecar`` set names to the processors they serve; docs/builtins.md
describes every processor, its options and what it does not support.
"""

from __future__ import annotations

from collections.abc import Callable

from procmesh import Processor


def _unicode() -> list[Processor]:
    from procmesh_sidecars.builtins.unicode_normalizer import UnicodeNormalizer

    return [UnicodeNormalizer()]


def _token_limiter() -> list[Processor]:
    from procmesh_sidecars.builtins.token_limiter import TokenLimiter

    return [TokenLimiter()]


def _tool_call_filter() -> list[Processor]:
    from procmesh_sidecars.builtins.tool_call_filter import ToolCallFilter

    return [ToolCallFilter()]


def _tool_search() -> list[Processor]:
    from procmesh_sidecars.builtins.tool_search import ToolSearch

    return [ToolSearch()]


def _regex_filter() -> list[Processor]:
    from procmesh_sidecars.builtins.regex_filter import RegexFilter

    return [RegexFilter()]


def _batch_parts() -> list[Processor]:
    from procmesh_sidecars.builtins.batch_parts import BatchParts

    return [BatchParts()]


def _structured_output() -> list[Processor]:
    from procmesh_sidecars.builtins.structured_output import StructuredOutput

    return [StructuredOutput()]


def _response_cache() -> list[Processor]:
    from procmesh_sidecars.builtins.response_cache import ResponseCache

    return [ResponseCache()]


def _background_work() -> list[Processor]:
    from procmesh_sidecars.builtins.signals import BackgroundWorkSignals

    return [BackgroundWorkSignals()]


def _ensure_final_response() -> list[Processor]:
    from procmesh_sidecars.builtins.signals import EnsureFinalResponse

    return [EnsureFinalResponse()]


def _steering_reminder() -> list[Processor]:
    from procmesh_sidecars.builtins.signals import SteeringReminder

    return [SteeringReminder()]


def _guards() -> list[Processor]:
    from procmesh_sidecars.builtins import guards

    return guards.processors()


SETS: dict[str, Callable[[], list[Processor]]] = {
    "unicode-normalizer": _unicode,
    "token-limiter": _token_limiter,
    "tool-call-filter": _tool_call_filter,
    "tool-search": _tool_search,
    "regex-filter": _regex_filter,
    "batch-parts": _batch_parts,
    "structured-output": _structured_output,
    "response-cache": _response_cache,
    "background-work-signals": _background_work,
    "ensure-final-response": _ensure_final_response,
    "steering-reminder": _steering_reminder,
    "guards": _guards,
}
"""One ``procmesh-sidecar`` set per built-in, named by its processor id (``guards``: the five
LLM-judged guards)."""


def processors() -> list[Processor]:
    """Every built-in of this package (not the default error processors)."""
    return [p for make in SETS.values() for p in make()]
