"""The docs name only metrics that exist, with their real labels: every ``procmesh_*`` name a doc
writes is one a collector registers, and every ``procmesh_name{label,...}`` names only labels the
metric's definition declares (a label renamed in the code would leave a dashboard query in the docs
that matches nothing).

The truth is read from the source: each call whose first argument is a ``procmesh_*`` string
(``Counter(...)``, ``Histogram(...)``, a custom collector's ``GaugeMetricFamily(...)``) and its
label names (third positional argument, ``labelnames=`` or ``labels=``).
`test_the_check_catches_made_up_labels` feeds it a made-up document. The other way round, every
metric a collector registers is named on some page (`test_every_registered_metric_is_documented`),
and the Alerts table of docs/operations.md lists deploy/prometheus/alerts.yml's rules with their
severities (`test_the_alerts_table_is_the_rules`); a query's label values are strings the code
writes (`test_label_values_in_the_docs_are_written_by_the_code`).
"""

from __future__ import annotations

import ast
import functools
import re

from tests.conftest import REPO
from tests.unit.doc_pages import DOCS, PACKAGES, Doc, _rel, made_up

SOURCES = ("sdk/procmesh", "orchestrator/procmesh_orchestrator", "sidecars/procmesh_sidecars")


def _labels(call: ast.Call) -> set[str] | None:
    """The label names a metric definition declares; None where they are computed (not checked)."""
    given = [k.value for k in call.keywords if k.arg in ("labelnames", "labels")] + call.args[2:3]
    if not given:
        return set()
    try:
        return set(ast.literal_eval(given[0]))
    except ValueError:
        return None


METRIC_TYPES = ("Counter", "Gauge", "Histogram", "Summary", "Info", "Enum")
"""The prometheus_client classes (and their *MetricFamily twins) a metric is registered with."""


@functools.cache
def registered_metrics() -> frozenset[str]:
    """The procmesh_* metrics a collector registers (not a ContextVar that shares the prefix)."""
    return frozenset(metric_kinds())


def undocumented(metrics: set[str], texts: list[str]) -> list[str]:
    """The metrics no page names (a counter by its name with or without `_total`)."""
    said = set(re.findall(r"\bprocmesh_[a-z_]*[a-z]", "\n".join(texts)))
    return sorted(m for m in metrics if m not in said and f"{m}_total" not in said)


def metric_labels() -> dict[str, list[set[str] | None]]:
    """Each procmesh_* metric the source defines: the label sets of its definitions."""
    found: dict[str, list[set[str] | None]] = {}
    for folder in SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            if "v1" in path.relative_to(REPO).parts:
                continue  # generated code defines no metric
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                    name = node.args[0].value
                    if isinstance(name, str) and re.fullmatch(r"procmesh_[a-z_]+", name):
                        found.setdefault(name, []).append(_labels(node))
    return found


def label_problems(doc: Doc, defined: dict[str, list[set[str] | None]]) -> list[str]:
    """Every ``procmesh_name{a,b}`` in the doc names labels one definition of the metric declares
    (a counter's ``_total`` and a histogram's ``_bucket``/``_count``/``_sum`` are its own name)."""
    problems = []
    for name, labels in sorted(set(re.findall(r"\b(procmesh_[a-z_]+)\{([a-z_, ]+)\}", doc.text))):
        said = {label.strip() for label in labels.split(",")}
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        sets = defined.get(name) or defined.get(base) or []
        if sets and not any(declared is None or said <= declared for declared in sets):
            known = " or ".join(sorted(",".join(sorted(d or ())) for d in sets))
            problems.append(f"{_rel(doc.path)}: {name}{{{labels}}}: its labels are {{{known}}}")
    return problems


def test_metric_labels_in_the_docs_are_declared() -> None:
    defined = metric_labels()
    assert len(defined) >= 20  # the source was read
    docs = [Doc.parse(path) for path in DOCS]
    said = [m for doc in docs for m in re.findall(r"\bprocmesh_[a-z_]+\{[a-z_, ]+\}", doc.text)]
    assert len(said) >= 20  # the docs write labels this way
    assert [p for doc in docs for p in label_problems(doc, defined)] == []


def test_the_check_catches_made_up_labels() -> None:
    fake = made_up(
        "`procmesh_sidecar_serving{sidecar}`, `procmesh_sidecar_serving{pod}` and "
        "`procmesh_frobs_total{x}` (no such metric: metric_problems says so).\n",
    )
    assert label_problems(fake, metric_labels()) == [
        "docs/made-up.md: procmesh_sidecar_serving{pod}: its labels are {sidecar}"
    ]


# -- metric names --------------------------------------------------------------------------------


def metric_problems(doc: Doc) -> list[str]:
    """Every procmesh_* metric name in the doc is one a collector registers (a string in the source)."""
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in ("sdk/procmesh", "orchestrator/procmesh_orchestrator")
        for path in (REPO / folder).rglob("*.py")
    )
    names = set(re.findall(r"\bprocmesh_[a-z_]*[a-z]\b", doc.text)) - set(PACKAGES)
    missing = [name for name in sorted(names) if f'"{name}"' not in source]
    return [f"{_rel(doc.path)}: metric {name} is not registered" for name in missing]


def test_metric_names_are_registered(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in metric_problems(doc)] == []


def test_the_check_catches_made_up_metric_names() -> None:
    fake = made_up("Count `procmesh_runs_total` and `procmesh_frobs_total`.\n")
    assert metric_problems(fake) == ["docs/made-up.md: metric procmesh_frobs_total is not registered"]


def test_every_registered_metric_is_documented(docs: list[Doc]) -> None:
    metrics = registered_metrics()
    assert {"procmesh_sidecar_serving", "procmesh_processor_call_duration_seconds"} <= metrics  # read
    assert "procmesh_run_id" not in metrics  # a ContextVar, not a metric
    assert undocumented(metrics, [doc.text for doc in docs]) == []
    assert undocumented({"procmesh_runs_total", "procmesh_frobs"}, ["`procmesh_runs_total`"]) == [
        "procmesh_frobs"
    ]


# -- alerts --------------------------------------------------------------------------------------


def alert_problems(text: str, rules: dict[str, str]) -> list[str]:
    """docs/operations.md's Alerts table has a row for each rule of deploy/prometheus/alerts.yml,
    with its severity, and no other row."""
    rows = dict(re.findall(r"^\| `(Procmesh\w+)` \|[^|]*\| (\w+) \|", text, flags=re.M))
    problems = [f"docs/operations.md: alert {name} has no row" for name in sorted(set(rules) - set(rows))]
    problems += [f"docs/operations.md: alert {name} is no rule" for name in sorted(set(rows) - set(rules))]
    return problems + [
        f"docs/operations.md: alert {name} is {rules[name]}, not {rows[name]}"
        for name in sorted(set(rows) & set(rules))
        if rows[name] != rules[name]
    ]


def test_the_alerts_table_is_the_rules() -> None:
    import yaml

    groups = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))[
        "groups"
    ]
    rules = {r["alert"]: r["labels"]["severity"] for g in groups for r in g["rules"] if "alert" in r}
    assert len(rules) >= 10  # the rules were read
    assert alert_problems((REPO / "docs" / "operations.md").read_text(encoding="utf-8"), rules) == []
    made_up = "| `ProcmeshSidecarDown` | down | warning | |\n| `ProcmeshFrob` | never | info | |\n"
    problems = alert_problems(made_up, rules)
    assert "docs/operations.md: alert ProcmeshSidecarDown is critical, not warning" in problems
    assert "docs/operations.md: alert ProcmeshFrob is no rule" in problems
    assert "docs/operations.md: alert ProcmeshOrchestratorDown has no row" in problems


# -- lists of a sidecar's series -----------------------------------------------------------------


def sidecar_list_problems(doc: Doc, series: set[str]) -> list[str]:
    """A passage that lists what a sidecar serves (a paragraph or table row naming both
    `procmesh_sidecar_hook_calls_total` and `procmesh_sidecar_build_info`) names every series the
    SDK registers (`series`)."""
    problems = []
    passages = [
        line
        for part in re.split(r"\n\s*\n", doc.text)
        for line in (part.split("\n|") if "|" in part else [part])
    ]
    for passage in passages:
        if "procmesh_sidecar_hook_calls_total" in passage and "procmesh_sidecar_build_info" in passage:
            problems += [
                f"{_rel(doc.path)}: a list of a sidecar's series lacks {name}"
                for name in sorted(series)
                if not re.search(rf"\b{name}\b", passage)
            ]
    return problems


def test_lists_of_a_sidecars_series_are_complete(docs: list[Doc]) -> None:
    sdk = {
        n
        for n in registered_metrics()
        if n.startswith("procmesh_sidecar_") and n != "procmesh_sidecar_serving"
    }
    assert "procmesh_sidecar_tool_calls_total" in sdk  # the SDK's series were read
    assert [p for doc in docs for p in sidecar_list_problems(doc, sdk)] == []
    fake = made_up(
        "It serves `procmesh_sidecar_hook_calls_total` and `procmesh_sidecar_build_info`.\n",
    )
    assert "docs/made-up.md: a list of a sidecar's series lacks procmesh_sidecar_tool_calls_total" in (
        sidecar_list_problems(fake, sdk)
    )


# -- label values --------------------------------------------------------------------------------


@functools.cache
def source_strings() -> str:
    """The packages' Python and the Node SDK's JavaScript, where label values are string literals."""
    folders = (*SOURCES, "sdk/node/lib")
    paths = [
        p
        for f in folders
        for p in (REPO / f).rglob("*")
        if p.suffix in (".py", ".js") and "v1" not in p.parts
    ]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def label_value_problems(doc: Doc, source: str) -> list[str]:
    """Every value a doc's query gives a label (`{outcome="run_ended"}`, `{outcome=~"a|b"}`) is a
    string the source writes: a renamed outcome leaves no query in the docs that matches nothing."""
    problems = []
    for name, inner in re.findall(r"\b(procmesh_[a-z_]+)\{([^}]*=[^}]*)\}", doc.text):
        for label, values in re.findall(r'(\w+)=~?"([^"]*)"', inner):
            problems += [
                f'{_rel(doc.path)}: {name}{{{label}="{value}"}}: no code writes {value!r}'
                for value in values.split("|")
                if value and not re.search(rf"[\"']{re.escape(value)}[\"']", source)
            ]
    return problems


def test_label_values_in_the_docs_are_written_by_the_code(docs: list[Doc]) -> None:
    source = source_strings()
    assert [p for doc in docs for p in label_value_problems(doc, source)] == []
    fake = made_up(
        '`procmesh_judge_calls_saved_total{by="precheck"}` and `procmesh_runs_total{status="frobbed"}`.\n'
    )
    assert label_value_problems(fake, source) == [
        "docs/made-up.md: procmesh_runs_total{status=\"frobbed\"}: no code writes 'frobbed'"
    ]


# -- metric types ----------------------------------------------------------------------------------


@functools.cache
def metric_kinds() -> dict[str, frozenset[str]]:
    """Each procmesh_* metric a collector registers: the prometheus_client types it is registered
    with (`Histogram`, `Counter`, ...; a custom collector's `*MetricFamily` by its type)."""
    found: dict[str, set[str]] = {}
    for folder in SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                    func = node.func
                    kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    name = str(node.args[0].value)
                    if kind.removesuffix("MetricFamily") in METRIC_TYPES and name.startswith("procmesh_"):
                        found.setdefault(name, set()).add(kind.removesuffix("MetricFamily"))
    return {name: frozenset(kinds) for name, kinds in found.items()}


def kind_problems(doc: Doc, kinds: dict[str, frozenset[str]]) -> list[str]:
    """A metric table's row (`| `procmesh_x` (histogram; ...) | labels |`) says `histogram` exactly
    for a metric registered as a Histogram: a query needs its `_bucket` series, and a counter
    has none."""
    problems = []
    for name, said in re.findall(r"^\| `(procmesh_[a-z_]+)(?:\{[^}]*\})?`([^|]*)\|", doc.text, flags=re.M):
        registered = kinds.get(name) or kinds.get(name.removesuffix("_total"))
        if registered is None:
            continue  # not registered: test_metric_names_are_registered says so
        if ("histogram" in said) != ("Histogram" in registered):
            kind = "a histogram" if "Histogram" in registered else f"a {'/'.join(sorted(registered)).lower()}"
            problems.append(f"{_rel(doc.path)}: {name} is {kind}, and its row says otherwise")
    return problems


def test_metric_tables_say_which_metrics_are_histograms(docs: list[Doc]) -> None:
    kinds = metric_kinds()
    assert kinds["procmesh_gateway_batch_size"] == {"Histogram"}  # the source was read
    rows = [r for doc in docs for r in re.findall(r"^\| `procmesh_", doc.text, flags=re.M)]
    assert len(rows) >= 30  # the tables were found
    assert [p for doc in docs for p in kind_problems(doc, kinds)] == []
    fake = made_up(
        "| metric | labels |\n|---|---|\n| `procmesh_run_duration_seconds` | `agent` |\n"
        "| `procmesh_runs_total` (histogram) | `agent` |\n"
        "| `procmesh_judge_verdict_seconds` (histogram) | |\n"
    )
    assert kind_problems(fake, kinds) == [
        "docs/made-up.md: procmesh_run_duration_seconds is a histogram, and its row says otherwise",
        "docs/made-up.md: procmesh_runs_total is a counter, and its row says otherwise",
    ]
