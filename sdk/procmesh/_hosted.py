"""One hosted processor: its hooks and their declared arguments, options validation, metrics."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from procmesh import convert
from procmesh._hookloop import HookLoop
from procmesh._metrics import Series, SidecarMetrics
from procmesh._processor import HOOK_ARGUMENTS, Processor, hook_parameters
from procmesh.errors import InvalidInputError
from procmesh.hooks import BY_NAME
from procmesh.v1 import processor_pb2 as ppb

STREAM_HOOK = "process_output_stream"
"""Its calls are counted per session; each part in procmesh_sidecar_stream_parts_total (its `Series`)."""

NO_OPTIONS_SCHEMA = json.dumps({"additionalProperties": False, "type": "object"}, sort_keys=True)
"""What ``Describe`` publishes for a processor that takes no options (no ``Options`` model and no
hook declaring ``options`` or ``**kwargs``): the orchestrator then refuses a config's options for
it at start-up, instead of starting with options nothing reads."""

_OPTIONS_CACHE_SIZE = 256
"""Validated options kept per processor (a config has few distinct option sets)."""


class Tally:
    """A stream batch's parts through one processor's hook: each counted at once in its `Series`,
    their time observed once, as their mean, when the batch ends (`end`, on the hook loop)."""

    __slots__ = ("parts", "seconds", "series")

    def __init__(self, series: Series) -> None:
        self.series = series
        self.parts = 0
        self.seconds = 0.0

    def add(self, outcome: str, seconds: float) -> None:
        counts = self.series.outcomes  # `Series.count`, without its call: once per part
        counts[outcome] = counts.get(outcome, 0) + 1
        self.parts += 1
        self.seconds += seconds

    def passed(self, parts: int, seconds: float) -> None:
        """`add` for `parts` calls that ended "ok", taking `seconds` together."""
        if parts:
            counts = self.series.outcomes
            counts["ok"] = counts.get("ok", 0) + parts
            self.parts += parts
            self.seconds += seconds

    def end(self) -> None:
        """The batch ended: its latency observation, and the tally emptied for the next one."""
        if self.parts:
            self.series.observe(self.seconds / self.parts)
        self.parts, self.seconds = 0, 0.0


class Hosted:
    """One hosted processor with what the servicer needs per call, computed once."""

    def __init__(self, processor: Processor, *, threaded: bool = True) -> None:
        if not processor.id:
            raise ValueError(f"{type(processor).__name__} has no id")
        self.processor = processor
        self.id = processor.id
        self.hooks = {name: getattr(processor, name) for name in type(processor).implemented_hooks()}
        self.params = {name: hook_parameters(fn) for name, fn in self.hooks.items()}
        for name, params in self.params.items():
            unknown = sorted((params or frozenset()) - HOOK_ARGUMENTS[name])
            if unknown:
                raise TypeError(
                    f"{type(processor).__name__}.{name} declares unknown arguments {unknown}; "
                    f"available: {sorted(HOOK_ARGUMENTS[name])}"
                )
        self.decodes = {
            name: params is None or bool(params & BY_NAME[name].own) for name, params in self.params.items()
        }
        """Per hook: whether it reads anything of its request beyond the context (else it is not decoded)."""
        self.series = {name: Series() for name in self.hooks}
        """Per hook: its calls (a stream's parts) and latencies, carried into the metrics when
        they are collected (`Series`; `track`)."""
        self.options_cache: dict[bytes, Any] = {}
        name = f"procmesh-hooks:{self.id[:32]}"
        self.loop = HookLoop(name, threaded=threaded, quick=processor.quick_hooks)
        """Where this processor's setup, hooks and teardown run (started by the server)."""

    def track(self, metrics: SidecarMetrics) -> None:
        """Have `metrics` carry this processor's `series` into its prometheus series."""
        for hook, series in self.series.items():
            counter = metrics.stream_parts if hook == STREAM_HOOK else metrics.hook_calls
            metrics.flush.track(series, self.id, hook, counter)

    def session_ended(self, metrics: SidecarMetrics, outcome: str) -> None:
        """Count one output-stream session of this processor as one hook call."""
        metrics.hook_calls.labels(self.id, STREAM_HOOK, outcome).inc()

    def options(self, struct: Any) -> Any:
        """The request's options: validated by the processor's Options model when it has one."""
        raw = convert.from_struct(struct)
        model = self.processor.Options
        if model is None:
            return raw
        key = struct.SerializeToString(deterministic=True)
        cached = self.options_cache.get(key)
        if cached is None:
            accepted = _option_names(model)
            unknown = sorted(set(raw) - accepted) if accepted is not None else []
            if unknown:
                raise InvalidInputError(
                    f"invalid options for processor {self.id!r}: unknown keys {unknown} "
                    f"(accepted: {sorted(accepted or ())})"
                )
            try:
                cached = model.model_validate(raw)
            except ValidationError as exc:
                raise InvalidInputError(f"invalid options for processor {self.id!r}: {exc}") from exc
            if len(self.options_cache) < _OPTIONS_CACHE_SIZE:
                self.options_cache[key] = cached
        return cached

    def info(self) -> ppb.ProcessorInfo:
        """This processor as ``Describe`` lists it."""
        proc = self.processor
        schema = ""
        if proc.Options is not None and issubclass(proc.Options, BaseModel):
            schema = json.dumps(published_schema(proc.Options), sort_keys=True)
        elif proc.Options is None and not any(p is None or "options" in p for p in self.params.values()):
            schema = NO_OPTIONS_SCHEMA
        return ppb.ProcessorInfo(
            id=self.id,
            name=proc.name or self.id,
            description=proc.description,
            hooks=[BY_NAME[h].enum for h in self.hooks],  # type: ignore[misc]
            process_data_parts=proc.process_data_parts,
            options_schema_json=schema,
            speculative=proc.speculative,
        )


def published_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The Options model's JSON schema as ``Describe`` publishes it: closed to unknown top-level
    keys exactly when `options` refuses them, so the orchestrator's start-up check refuses the
    same configs the first request would (pydantic leaves ``additionalProperties`` open)."""
    schema = model.model_json_schema()
    if _option_names(model) is not None:
        schema["additionalProperties"] = False
    return schema


def _option_names(model: type[BaseModel]) -> set[str] | None:
    """Keys an Options model accepts: field names and aliases (None: any key, extra='allow')."""
    if model.model_config.get("extra") == "allow":
        return None
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
        if isinstance(field.validation_alias, str):
            names.add(field.validation_alias)
    return names
