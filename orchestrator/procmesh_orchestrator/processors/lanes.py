"""Lane entries bound to their sidecars: processor handles and a workflow's parallel and conditional steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from procmesh import ProcessorClient
from procmesh.hooks import BY_ENUM


def hook_names(enums: Iterable[int]) -> frozenset[str]:
    """The hook names of a processor's ``Describe`` entry (values this build does not know are left out)."""
    return frozenset(BY_ENUM[e].name for e in enums if e in BY_ENUM)


@dataclass(frozen=True)
class ProcessorHandle:
    """One lane entry bound to its sidecar: what to call, with which options and policy."""

    key: str
    processor_id: str
    """The processor's identity in the run: state, tripwires, violations, metrics (its `name`, or its id)."""
    client: ProcessorClient
    options: struct_pb2.Struct
    hooks: frozenset[str]
    process_data_parts: bool
    timeout: float
    on_failure: str
    shadow: bool = False
    """Run and record the verdict, never enforce it (a shadow processor also always fails open)."""
    hosted_id: str = ""
    """The id the sidecar hosts it under, when the lane entry renamed it (several instances)."""
    tool_host: bool = False
    """The sidecar's hosted tools, not a processor: ExecuteTool goes with an empty processor id."""
    speculative: bool = False
    """Describe declared it speculative and its lane entry left that on: it may be called before
    its input is final (`run.speculation`)."""
    fuse_key: str = ""
    """Lane neighbours with the same non-empty key share one request (the sidecar's name when its
    Describe says ``fuses``); empty: never fused (shadow processors, tool hosts)."""
    stream_timeout: float = 600.0
    """Seconds one ProcessOutputStream session may stay open (``streamTimeout``; the run's remaining
    deadline caps it); `timeout` bounds each part's answer and the stream's end."""

    def has(self, hook: str) -> bool:
        """Whether the processor implements `hook`."""
        return hook in self.hooks

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ProcessorHandle, ...]:
        """Itself: a processor is in every run of its lane."""
        return (self,)


@dataclass(frozen=True)
class ParallelGroup:
    """A workflow's parallel step: branches run concurrently on the same input.

    Every branch's signals, custom chunks and aborts apply (the first abort in
    branch order wins, with its own processor id); the `pick` branch's result
    (its messages, prompt, part) is what goes on, as ``.map()`` chooses in the seeds.
    """

    key: str
    processor_id: str
    branches: tuple[ProcessorHandle, ...]
    pick: int = 0
    speculative = False
    """A group runs its branches itself: it is never called speculatively, nor fused."""
    fuse_key = ""

    def has(self, hook: str) -> bool:
        """Whether any branch implements `hook`."""
        return any(b.has(hook) for b in self.branches)

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ParallelGroup, ...]:
        """Itself: the group runs as one lane entry."""
        return (self,)


@dataclass(frozen=True)
class Conditional:
    """A workflow's conditional step: `then` when every `when` key equals the request context's value."""

    when: dict[str, Any]
    then: tuple[ProcessorHandle, ...]
    otherwise: tuple[ProcessorHandle, ...] = ()

    def expand(self, request_context: Mapping[str, Any]) -> tuple[ProcessorHandle, ...]:
        """The branch this run takes (decided once per run)."""
        ok = all(request_context.get(k) == v for k, v in self.when.items())
        return self.then if ok else self.otherwise


LaneItem = ProcessorHandle | ParallelGroup | Conditional
"""A resolved lane entry; conditionals are decided once per run."""
RunLaneItem = ProcessorHandle | ParallelGroup
"""A lane entry as a run calls it."""
