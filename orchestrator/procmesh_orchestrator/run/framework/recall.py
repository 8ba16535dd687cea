"""Semantic recall in the run: older messages like the caller's, found by their embeddings.

As the reference's ``SemanticRecall`` processor (``@mastra/core`` processors/memory): after the
history window is loaded, the caller's last user message is embedded and the ``topK`` stored
messages most like it (in the resource, or the thread: ``scope``) are read with ``messageRange``
neighbours of their thread. Messages already in the call are skipped; this thread's go ahead of
the loaded history with the ``memory`` source; other threads' (resource scope) go in one system
message worded as the reference's. When the turn is saved, each of its messages is embedded (its
text cut in chunks) and the vectors are saved in the turn's transaction, so history is never
embedded again.

Every embedding call is counted (``procmesh_embedding_calls_total``, tokens in
``procmesh_embedding_tokens_total``), traced as an ``embeddings`` client span, and charged to the
run's cost control like a model call. A failing embedder does not fail the run (the reference logs
and goes on): the call goes without recall, or the turn is saved without vectors (not recallable),
logged and counted. A failing store fails the run, as the history load does.

`search_messages` is the same search outside a run (the memory API's ``searchMemory``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from procmesh import tracing
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.framework.cost import CostLimitError
from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.store.recall import Hit, MessageEmbedding, Range, recall_index

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)

Message = dict[str, Any]

CHARS_PER_TOKEN = 4
CHUNK_TOKENS = 4096


class RecallOptions(Protocol):
    """What the run reads of an agent's ``memory.semanticRecall`` (the config's
    `SemanticRecallConfig` is one; the run stands alone, so it names only these)."""

    @property
    def embedder(self) -> str: ...
    @property
    def top_k(self) -> int: ...
    @property
    def scope(self) -> str: ...
    @property
    def threshold(self) -> float | None: ...
    @property
    def span(self) -> Range: ...


class EmbeddingResult(Protocol):
    """One embedding call's vectors (in the order of its inputs) and the tokens it cost."""

    @property
    def vectors(self) -> list[list[float]]: ...
    @property
    def tokens(self) -> int: ...


class Embedder(Protocol):
    """An embedding model (the providers' `EmbeddingModel` is one): `APICallError` on failure."""

    async def embed(self, texts: list[str]) -> EmbeddingResult: ...


def chunk_text(text: str, tokens: int = CHUNK_TOKENS) -> list[str]:
    """`text` cut at whitespace into chunks of at most ``tokens * CHARS_PER_TOKEN`` characters (a
    longer word is cut by characters), as the reference cuts a message before embedding it."""
    size = tokens * CHARS_PER_TOKEN
    chunks: list[str] = []
    current = ""
    for word in re.split(r"\s+", text):
        if len(word) > size:
            if current:
                chunks.append(current)
                current = ""
            chunks.extend(word[i : i + size] for i in range(0, len(word), size))
            continue
        joined = f"{current} {word}" if current else word
        if len(joined) > size:
            if current:
                chunks.append(current)
            current = word
        else:
            current = joined
    if current:
        chunks.append(current)
    return chunks


@dataclass(frozen=True)
class Recalled:
    """What a search found: the hits, best first, and their messages with their ranges, by
    thread and in thread order."""

    hits: list[Hit]
    messages: list[Message]


def message_text(msg: Message) -> str:
    """The text the reference embeds of a message: ``content.content``, else its text parts."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, dict):
        return ""
    if isinstance(content.get("content"), str) and content["content"].strip():
        return str(content["content"])
    return " ".join(
        p.get("text") or "" for p in content.get("parts") or [] if p.get("type") == "text"
    ).strip()


class SemanticRecall:
    """An agent's semantic recall: its options, its embedder, its store's index."""

    def __init__(
        self,
        config: RecallOptions,
        embedder: Embedder,
        store: MemoryStore,
        metrics: OrchestratorMetrics,
    ) -> None:
        self.config = config
        self.embedder = embedder
        self.store = store
        self.metrics = metrics

    async def embed(self, texts: list[str], purpose: str, run: RunCore | None = None) -> list[list[float]]:
        """One embedding call: counted, traced, and charged to the run's cost control."""
        model_id = self.config.embedder
        span = tracing.start(
            f"embeddings {model_id}",
            kind="client",
            attributes={
                "gen_ai.operation.name": "embeddings",
                "gen_ai.request.model": model_id,
                "procmesh.embedding.purpose": purpose,
                "procmesh.embedding.inputs": len(texts),
            },
        )
        cost = getattr(run, "cost", None)
        reservation = await cost.reserve(model_id, texts, 0) if cost is not None else None
        started = time.perf_counter()
        try:
            result = await self.embedder.embed(texts)
        except BaseException as exc:
            self.metrics.embedding_calls.labels(model_id, purpose, "error").inc()
            span.end(exc)
            if reservation is not None:
                await cost.release(reservation)  # type: ignore[union-attr]
            raise
        self.metrics.embedding_calls.labels(model_id, purpose, "ok").inc()
        self.metrics.embedding_tokens.labels(model_id).inc(result.tokens)
        self.metrics.embedding_duration.labels(model_id).observe(time.perf_counter() - started)
        span.set("gen_ai.usage.input_tokens", result.tokens)
        span.end(None)
        if reservation is not None:
            await cost.settle(reservation, {"inputTokens": result.tokens, "outputTokens": 0})  # type: ignore[union-attr]
        return result.vectors

    async def search(
        self,
        query: str,
        *,
        resource_id: str,
        thread_id: str | None = None,
        top_k: int | None = None,
        span: Range | None = None,
        run: RunCore | None = None,
    ) -> Recalled:
        """The stored messages of the resource (of the thread, when given) most like `query`."""
        cfg = self.config
        index = recall_index(self.store)
        vectors = await self.embed(chunk_text(query), "query", run)
        hits: list[Hit] = []
        for vector in vectors:
            found = await index.nearest(
                cfg.embedder, vector, resource_id=resource_id, thread_id=thread_id, top_k=top_k or cfg.top_k
            )
            hits += [h for h in found if cfg.threshold is None or h.score >= cfg.threshold]
        hits.sort(key=lambda h: -h.score)
        messages = await index.around(resource_id, hits, span or cfg.span) if hits else []
        return Recalled(hits, messages)

    async def recall(self, run: RunCore, thread_id: str, resource_id: str) -> None:
        """Add the messages like the call's last user message to the call (see the module)."""
        query = next(
            (message_text(m) for m in reversed(run.ml.view(msgs.INPUT)) if m.get("role") == "user"), ""
        )
        if not query:
            return
        scope_thread = thread_id if self.config.scope == "thread" else None
        try:
            found = await self.search(query, resource_id=resource_id, thread_id=scope_thread, run=run)
        except (APICallError, CostLimitError) as exc:
            log.error(
                "run %s: semantic recall: the embedding failed; no recall this call: %s", run.run_id, exc
            )
            return
        present = {m.get("id") for m in run.ml.items}
        fresh = [
            m
            for m in found.messages
            if m.get("id") not in present and m.get("role") not in ("system", "signal")
        ]
        here = [m for m in fresh if m.get("threadId", thread_id) == thread_id]
        elsewhere = [m for m in fresh if m.get("threadId", thread_id) != thread_id]
        if here:
            run.ml.prepend(here, msgs.MEMORY)  # older than the window: the reference orders by time
        if elsewhere:
            run.system.append(msgs.text_message("system", other_threads_text(elsewhere, thread_id)))

    async def embed_turn(self, run: RunCore, turn: Sequence[Message]) -> list[MessageEmbedding]:
        """The embeddings of the turn's messages' chunks, in one call ([] when it fails: logged)."""
        chunks: list[tuple[str, int, str]] = []
        for msg in turn:
            if msg.get("role") in ("system", "signal") or not isinstance(msg.get("id"), str):
                continue
            chunks += [(msg["id"], i, text) for i, text in enumerate(chunk_text(message_text(msg)))]
        if not chunks:
            return []
        try:
            vectors = await self.embed([text for _, _, text in chunks], "turn", run)
        except (APICallError, CostLimitError) as exc:
            log.error(
                "run %s: semantic recall: the embedding failed; this turn is saved without embeddings "
                "(it will not be recalled): %s",
                run.run_id,
                exc,
            )
            return []
        model = self.config.embedder
        return [MessageEmbedding(mid, model, v, i) for (mid, i, _), v in zip(chunks, vectors, strict=True)]


def other_threads_text(messages: list[Message], thread_id: str) -> str:
    """Other threads' recalled messages as the reference shows them (``formatCrossThreadMessages``)."""
    out = ""
    last_day = None
    for msg in sorted(messages, key=lambda m: (str(m.get("createdAt", "")), str(m.get("threadId", "")))):
        moment = _moment(msg.get("createdAt"))
        day = f"{moment.year}, {moment.strftime('%b')}, {moment.day}"
        if day != last_day:
            out += f"\nthe following messages are from {day}\n"
        last_day = day
        hour = moment.hour % 12 or 12
        at = f"{hour}:{moment.minute:02d} {'AM' if moment.hour < 12 else 'PM'}"
        where = "from previous conversation" if msg.get("threadId") not in (None, thread_id) else ""
        role = str(msg.get("role", "")).capitalize()
        out += f"Message {where} at {at}: {role}: {message_text(msg)}"
    return (
        "The following messages were remembered from a different conversation:\n"
        f"<remembered_from_other_conversation>\n{out}\n<end_remembered_from_other_conversation>"
    )


def _moment(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return datetime.fromtimestamp(0)


async def search_messages(
    recall: SemanticRecall,
    query: str,
    *,
    resource_id: str,
    thread_id: str | None = None,
    top_k: int | None = None,
    message_range: Range | None = None,
) -> Recalled:
    """The memory API's search (client-js ``searchMemory``): the stored messages of `resource_id`
    (of its thread `thread_id`, when given) most like `query`, with their ranges; the agent's
    ``topK`` and ``messageRange`` unless given. Embedder failures raise `APICallError`."""
    return await recall.search(
        query, resource_id=resource_id, thread_id=thread_id, top_k=top_k, span=message_range
    )
