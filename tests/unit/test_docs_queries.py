"""The docs' HTTP query parameters are the routes' own: a ``GET /path?a=&b=`` names only
parameters that route takes, and every parameter a route the page names takes is named on that
page (a parameter the code takes and the page never names, such as the memory search's
`memoryConfig`, leaves a reader unable to tell it is refused).

The truth is each route's own answer: the HTTP app's route table (as test_docs_reference.py builds
it) asked with a made-up parameter answers 400 naming the parameters it takes
(`service/http/bodies.py`, `takes_query`); a route that reads no query (a probe, a route answered
501) is not asked. `test_the_checks_catch_made_up_queries` feeds the checks a made-up document.
"""

from __future__ import annotations

import asyncio
import functools
import re

from starlette.requests import Request
from starlette.routing import BaseRoute, Match, Route

from procmesh_orchestrator.service._errors import BadRequestError
from tests.unit.doc_pages import Doc, _rel, made_up
from tests.unit.test_docs_reference import served_routes

PROBE = "zz-made-up"
"""A query parameter no route takes: the route's 400 names the ones it does."""

ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`|),;?]*)(?:\?([^\s`|),;]*))?")


@functools.cache
def routes() -> tuple[BaseRoute, ...]:
    return tuple(served_routes())


def route_of(method: str, path: str) -> BaseRoute | None:
    """The route a request to the doc's path reaches (the table's first full match)."""
    concrete = re.sub(r"\{[^}]*\}|:[A-Za-z]\w*", "x", re.sub(r"\[[^\]]*\]", "", path)).rstrip(".")
    scope = {"type": "http", "path": concrete, "method": method, "root_path": ""}
    return next((r for r in routes() if r.matches(scope)[0] == Match.FULL), None)


def taken(route: BaseRoute) -> frozenset[str] | None:
    """The query parameters the route takes, from its answer to a made-up one; None when it reads
    no query (the made-up parameter reaches the endpoint, or the route is no plain `Route`)."""
    if not isinstance(route, Route):
        return None
    return _taken(route.path, frozenset(route.methods or ()))


@functools.cache
def _taken(path: str, methods: frozenset[str]) -> frozenset[str] | None:
    route = next(
        r
        for r in routes()
        if isinstance(r, Route) and (r.path, frozenset(r.methods or ())) == (path, methods)
    )
    scope = {"type": "http", "method": "GET", "path": "/", "query_string": f"{PROBE}=1".encode()}

    async def ask() -> str | None:
        try:
            await route.endpoint(Request(scope))
        except BadRequestError as refused:
            return str(refused)
        except Exception:  # the endpoint ran on: it takes any query, or reads none
            return None
        return None

    said = asyncio.run(ask())
    found = re.search(r"\(this route takes (.*)\)$", said or "")
    if found is None:
        return None
    return frozenset() if found[1] == "none" else frozenset(found[1].split(", "))


def query_problems(doc: Doc) -> list[str]:
    """Each ``METHOD /path?a=&b=`` names only parameters the route takes, and each parameter a
    route the page names takes appears in one of the page's code spans."""
    named = set(re.findall(r"[\w\[\]]+", " ".join(doc.spans)))
    problems = []
    for method, path, query in sorted(set(ROUTE.findall(doc.text))):
        route = route_of(method, path)
        takes = None if route is None else taken(route)
        if takes is None:
            continue  # no route (test_docs_reference's check), or one that reads no query
        given = re.findall(r"(?:^|&|\[&)([\w\[\]]+?)=", query)
        problems += [
            f"{_rel(doc.path)}: {method} {path} takes no query parameter {p}" for p in given if p not in takes
        ]
        problems += [
            f"{_rel(doc.path)}: {method} {path} takes {p}, which the page never names"
            for p in sorted(takes - named)
        ]
    return sorted(set(problems))


def test_the_routes_answer_with_the_parameters_they_take() -> None:
    search = route_of("GET", "/api/memory/search")
    assert search is not None
    assert {"searchQuery", "limit", "requestContext"} <= (taken(search) or set())
    cancel = route_of("POST", "/api/agents/a/runs/r/cancel")
    assert cancel is not None
    assert taken(cancel) == frozenset()


def test_query_parameters_in_the_docs_are_the_routes(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in query_problems(doc)] == []


def test_the_checks_catch_made_up_queries() -> None:
    doc = made_up(
        "`GET /api/runs/decisions?since=T&sinse=T` and `GET /api/agents/{agentId}/suspended-runs`"
        " with `threadId`, `resourceId`, `fromDate`, `toDate`, `page`, `requestContext`; "
        "`since`, `until`, `agentId`, `limit`.\n"
    )
    assert query_problems(doc) == [
        "docs/made-up.md: GET /api/agents/{agentId}/suspended-runs takes perPage, which the page never names",
        "docs/made-up.md: GET /api/runs/decisions takes no query parameter sinse",
    ]
