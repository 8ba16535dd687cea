"""The counts the docs give of what an end-to-end test measures are the test's: docs/service.md's
"(N methods: W work, F answer 501)" of `@mastra/client-js`'s methods adds up, counts the table after
it, and equals what tests/e2e/service/test_clientjs_api.py asserts the real client finds; its
"(N methods: W work, F answer 501 ...)" of the memory methods is the sets
tests/e2e/service/test_clientjs_memory_api.py checks (`WORKS`, `NOT_SUPPORTED`); and the requests
tests/e2e/service/test_fuzz.py "sends" are its examples' sum (`max_examples`, one request each).
The unit tier runs no Node: the e2e tests' numbers are read from their source. And the agents
"`procmesh demo`" streams are as many as the pages say ("four agents on the demo model") and the
ones docs/running.md's demo table lists (`cli/demo.py`'s `SHOWCASE`).
`test_the_client_method_counts_are_the_tables_and_the_tests` also feeds the check a made-up table.
"""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

METHODS = re.compile(
    r"\((\d+) methods: (\d+) work, (\d+) answer 501\):\n\n"
    r"\| client method \| result \|\n\|[^\n]*\n((?:\|[^\n]*\n)+)"
)


def client_method_problems(text: str, measured: tuple[int, int]) -> list[str]:
    """service.md's "(N methods: W work, F answer 501)" adds up, counts the table after it (a span is
    one method, or the N of its "(N methods)"), and is what tests/e2e/service/test_clientjs_api.py
    finds the real client's methods do (its `(len(rows), len(works))`)."""
    found = METHODS.search(text)
    if found is None:
        return ["docs/service.md: no (N methods: W work, F answer 501) before the client methods' table"]
    total, works, refused = (int(found[i]) for i in (1, 2, 3))
    counted = {"works": 0, "501": 0}
    for row in found[4].splitlines():
        methods, result = row.strip("|").split(" | ", 1)
        many = re.findall(r"`[^`]+`(?: \((\d+) methods\))?", methods)
        counted["works" if result.startswith("works") else "501"] += sum(int(n or 1) for n in many)
    problems = []
    if total != works + refused:
        problems.append(f"docs/service.md: {works} work and {refused} answer 501 is not {total} methods")
    if (total, works) != measured:
        problems.append(f"docs/service.md: {total} methods, {works} work; the e2e test finds {measured}")
    if (counted["works"] + counted["501"], counted["works"]) != (total, works):
        problems.append(f"docs/service.md: the table has {counted['works']} working and {counted['501']} 501")
    return problems


def test_the_client_method_counts_are_the_tables_and_the_tests() -> None:
    source = (REPO / "tests" / "e2e" / "service" / "test_clientjs_api.py").read_text(encoding="utf-8")
    asserted = re.search(r"\(len\(rows\), len\(works\)\) == \((\d+), (\d+)\)", source)
    assert asserted is not None  # what the e2e test measures
    measured = (int(asserted[1]), int(asserted[2]))
    assert client_method_problems((REPO / "docs" / "service.md").read_text(encoding="utf-8"), measured) == []
    made_up = "(3 methods: 1 work, 1 answer 501):\n\n| client method | result |\n| --- | --- |\n"
    made_up += "| `a` | works |\n| `b(id).*` (2 methods) | 501: no |\n"
    assert client_method_problems(made_up, (3, 2)) == [
        "docs/service.md: 1 work and 1 answer 501 is not 3 methods",
        "docs/service.md: 3 methods, 1 work; the e2e test finds (3, 2)",
    ]


def test_the_memory_method_counts_are_the_tests_sets() -> None:
    source = (REPO / "tests" / "e2e" / "service" / "test_clientjs_memory_api.py").read_text(encoding="utf-8")
    sizes = {
        node.targets[0].id: len(node.value.elts if isinstance(node.value, ast.Set) else node.value.keys)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("WORKS", "NOT_SUPPORTED")
        and isinstance(node.value, ast.Set | ast.Dict)
    }
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    said = re.search(
        r"as `tests/e2e/service/test_clientjs_memory_api.py` finds it\s+\((\d+) methods: (\d+) work, (\d+)",
        text,
    )
    assert said is not None
    assert (int(said[1]), int(said[2]), int(said[3])) == (
        sizes["WORKS"] + sizes["NOT_SUPPORTED"],
        sizes["WORKS"],
        sizes["NOT_SUPPORTED"],
    )


def fuzz_requests(source: str) -> int:
    """The requests the fuzz module sends: one per example, so its tests' `max_examples` summed."""
    return sum(
        int(keyword.value.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "max_examples" and isinstance(keyword.value, ast.Constant)
    )


def test_the_fuzz_request_count_is_the_tests_examples() -> None:
    source = (REPO / "tests" / "e2e" / "service" / "test_fuzz.py").read_text(encoding="utf-8")
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    said = re.search(r"`tests/e2e/service/test_fuzz.py` sends (?:about )?([\d,]+) ", text)
    assert said is not None
    assert int(said[1].replace(",", "")) == fuzz_requests(source) > 1000
    assert (
        fuzz_requests(
            "@settings(FUZZ, max_examples=5)\ndef t(): ...\n@settings(max_examples=7)\ndef u(): ..."
        )
        == 12
    )


# -- the demo ------------------------------------------------------------------------------------

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}

_DEMO_RUNS = re.compile(r"\b(\w+) (?:streamed )?(?:agents|runs) on (?:the|a) (?:offline )?demo model")


def demo_problems(pages: dict[str, str], showcase: list[str]) -> list[str]:
    """Every "four agents on the demo model" counts the agents `procmesh demo` streams (its
    `SHOWCASE`), and docs/running.md's demo table (`| agent | shows |`) has a row for each, in order."""
    problems = [
        f"{name}: '{found[0]}': procmesh demo streams {len(showcase)}"
        for name, text in pages.items()
        for found in _DEMO_RUNS.finditer(text)
        if NUMBERS.get(found[1].lower()) != len(showcase)
    ]
    table = pages.get("docs/running.md", "").split("| agent | shows |", 1)[-1].split("\n\n")[0]
    rows = re.findall(r"^\| `([\w-]+)` \|", table, flags=re.M)
    if rows != showcase:
        problems.append(
            f"docs/running.md: the demo table's agents are {rows}; procmesh demo streams {showcase}"
        )
    return problems


def test_the_demo_the_docs_describe_is_the_demo() -> None:
    from procmesh_orchestrator.cli.demo import SHOWCASE

    showcase = [agent for agent, _title, _prompt in SHOWCASE]
    names = ["README.md", "docs/running.md", "docs/architecture.md"]
    pages = {name: (REPO / name).read_text(encoding="utf-8") for name in names}
    assert sum(len(_DEMO_RUNS.findall(text)) for text in pages.values()) >= 3  # the claims were found
    assert demo_problems(pages, showcase) == []


def test_the_demo_check_catches_a_made_up_count() -> None:
    pages = {
        "README.md": "runs the offline showcase: five streamed agents on a demo model; no API key",
        "docs/architecture.md": "procmesh demo: two sidecars, three runs on the demo model",
        "docs/running.md": "| agent | shows |\n|---|---|\n| `rewrite` | x |\n| `filter` | y |\n\n## Sidecars",
    }
    assert demo_problems(pages, ["rewrite", "filter", "guarded"]) == [
        "README.md: 'five streamed agents on a demo model': procmesh demo streams 3",
        "docs/running.md: the demo table's agents are ['rewrite', 'filter']; "
        "procmesh demo streams ['rewrite', 'filter', 'guarded']",
    ]
