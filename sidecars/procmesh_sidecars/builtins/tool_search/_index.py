"""The searchable catalog: a small BM25 index over tool names and descriptions, plus a name boost.

Pure and per request (the catalog is rebuilt from the options and the run's state at every
call), so it keeps no state of its own and is tested without a processor.
"""

from __future__ import annotations

import math
import re
from typing import Any

from procmesh_sidecars.builtins.tool_search._options import SearchOptions

_SPLIT = re.compile(r"""[\s\-_.,;:!?()\[\]{}'"]+""")
_K1 = 1.5
_B = 0.75
_DESCRIPTION_LIMIT = 150
# The catalog reserves the meta-tools' names (a catalog tool by that name would be unreachable).
META_TOOLS = ("search_tools", "load_tool")


def tokenize(text: str) -> list[str]:
    """Lowercase terms of at least two characters, split on whitespace and punctuation."""
    return [t for t in _SPLIT.split(text.lower()) if len(t) >= 2]


class BM25:
    """A small BM25 index (k1 1.5, b 0.75, IDF ln((N - df + 0.5) / (df + 0.5) + 1))."""

    def __init__(self, docs: dict[str, str]) -> None:
        self.terms = {doc_id: tokenize(text) for doc_id, text in docs.items()}
        self.df: dict[str, int] = {}
        for terms in self.terms.values():
            for term in set(terms):
                self.df[term] = self.df.get(term, 0) + 1
        total = sum(len(t) for t in self.terms.values())
        self.avg = total / len(self.terms) if self.terms else 0.0

    def search(self, query: str) -> list[tuple[str, float]]:
        """Documents matching any query term, best first."""
        n = len(self.terms)
        scores: dict[str, float] = {}
        for term in tokenize(query):
            df = self.df.get(term)
            if not df:
                continue
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
            for doc_id, terms in self.terms.items():
                tf = terms.count(term)
                if tf:
                    norm = tf + _K1 * (1 - _B + _B * (len(terms) / self.avg))
                    scores[doc_id] = scores.get(doc_id, 0.0) + idf * (tf * (_K1 + 1)) / norm
        return sorted(scores.items(), key=lambda kv: -kv[1])


def short(text: str) -> str:
    """A description cut to what a search result or the injected catalog shows."""
    return text if len(text) <= _DESCRIPTION_LIMIT else text[: _DESCRIPTION_LIMIT - 3] + "..."


class Catalog:
    """The catalog tools by name, with their index; meta-tool names are reserved."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        for tool in tools:
            name = tool["name"]
            if name in META_TOOLS:
                raise ValueError(f"tool-search: catalog tool name {name!r} is reserved for a meta-tool")
            if name in self.tools and self.tools[name] != tool:
                raise ValueError(f"tool-search: duplicate catalog tool name {name!r}")
            self.tools[name] = tool
        self.index = BM25({n: f"{n} {t.get('description', '')}" for n, t in self.tools.items()})

    def search(self, query: str, options: SearchOptions) -> list[dict[str, Any]]:
        if not self.tools:
            return []
        hits = self.index.search(query)[: options.top_k * 2]
        terms = [t for t in _SPLIT.split(query.lower()) if len(t) > 1]
        boosted = []
        for name, score in hits:
            lower = name.lower()
            for term in terms:
                if lower == term:
                    score += 5
                elif term in lower:
                    score += 2
            boosted.append((name, score))
        boosted.sort(key=lambda kv: -kv[1])
        return [
            {
                "name": name,
                "description": short(str(self.tools[name].get("description", ""))),
                "score": round(score * 100) / 100,
            }
            for name, score in boosted
            if score > options.min_score
        ][: options.top_k]

    def suggestions(self, name: str) -> list[str]:
        low = name.lower()
        return [n for n in self.tools if low in n.lower() or n.lower() in low][:3]
