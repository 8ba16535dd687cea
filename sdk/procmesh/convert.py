"""Conversion between the wire types (`procmesh.v1`) and the plain dicts hooks see.

Hooks work on JSON-shaped dicts that mirror the reference engine:
messages are MastraDBMessage dicts (``{"id", "role", "content": {"format": 2,
"parts": [...], "metadata": {...}}, ...}``) and chunks are ``{"type", "payload"}``
dicts (``{"type": "text-delta", "payload": {"text": "..."}}``; data chunks are
``{"type": "data-x", "data": ...}``). The orchestrator and the SDK convert at
the gRPC boundary with the functions here, so both sides agree on one mapping.

This module is the public face only; the mappings live in `procmesh._convert`,
one module per kind of record (JSON values, messages, chunks, per-turn records),
so that each stays small enough to read against its proto message.
"""

from __future__ import annotations

# The type aliases (Chunk, Message, JSON) were never in __all__; `X as X` keeps them importable here.
from procmesh._convert.chunks import (
    Chunk as Chunk,
)
from procmesh._convert.chunks import (
    abort_from_proto,
    abort_to_proto,
    chunk_from_proto,
    chunk_to_proto,
    usage_from_proto,
    usage_to_proto,
)
from procmesh._convert.messages import Message as Message
from procmesh._convert.messages import message_from_proto, message_to_proto
from procmesh._convert.turns import (
    prompt_from_proto,
    prompt_to_proto,
    signal_from_proto,
    signal_to_proto,
    step_from_proto,
    step_to_proto,
)
from procmesh._convert.values import JSON as JSON
from procmesh._convert.values import from_struct, from_value, to_struct, to_value
from procmesh.parts import part_provenance

__all__ = [
    "abort_from_proto",
    "abort_to_proto",
    "chunk_from_proto",
    "chunk_to_proto",
    "from_struct",
    "from_value",
    "message_from_proto",
    "message_to_proto",
    "part_provenance",
    "prompt_from_proto",
    "prompt_to_proto",
    "signal_from_proto",
    "signal_to_proto",
    "step_from_proto",
    "step_to_proto",
    "to_struct",
    "to_value",
    "usage_from_proto",
    "usage_to_proto",
]
