"""The docs name only Python names that exist: every dotted name of our packages in a code span
(`procmesh._encode.quiet_effects`, `procmesh_orchestrator.service._health`) imports; every
`procmesh.v1.Name` is a message, enum or service of the contract; any other `procmesh.a.b` (a span
attribute: `procmesh.processor.id`), and every `gen_ai.a.b` (`gen_ai.agent.name`), is a string
the code writes; every `Class.member` of a
class the public faces export (`App.run_ended`, `RunStream.detach()`) is one of its members; every
CamelCase, snake_case or UPPER_SNAKE name alone in a span (`SessionClock`, `fused_items`,
`MERGE_WINDOW`) is a word of the repository's source; and every
`python -m MODULE` of ours runs a module that exists.

Code moves (this session split config/schema.py, the model gateway and processors/calls.py) leave
such names behind in prose; the path checks (test_docs_paths.py) only see `a/b.py` paths.
`test_the_checks_catch_made_up_names` feeds the checks a made-up document.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import re
import textwrap
from pathlib import Path

import procmesh
import procmesh_orchestrator
from procmesh.v1 import agent_pb2, model_pb2, processor_pb2, types_pb2
from tests.conftest import REPO
from tests.unit.doc_pages import Doc, _command_lines, _rel, made_up

SOURCES = ("sdk/procmesh", "sdk/node/lib", "orchestrator/procmesh_orchestrator", "sidecars/procmesh_sidecars")

# -- dotted names --------------------------------------------------------------------------------


def _resolves(name: str) -> bool:
    """`a.b.c` imports as a module, or as a module's attribute (its attribute's, ...)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


@functools.cache
def contract_names() -> frozenset[str]:
    """The contract's top-level messages, enums and services (`Hook`, `ProcessorService`)."""
    names: set[str] = set()
    for module in (agent_pb2, model_pb2, processor_pb2, types_pb2):
        names |= {*module.DESCRIPTOR.message_types_by_name, *module.DESCRIPTOR.enum_types_by_name}
        names |= set(module.DESCRIPTOR.services_by_name)
    return frozenset(names)


@functools.cache
def source_text() -> str:
    """The packages' source, where a span attribute's name is written as a string."""
    paths = [p for folder in SOURCES for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".js")]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths if "v1" not in p.parts)


def dotted_problems(doc: Doc) -> list[str]:
    """Every `procmesh...` dotted name in a span is a Python name, a contract name or a string of
    the source; a file name (`procmesh.yaml`) and a host name (`enrich.procmesh.svc`) are neither."""
    problems = []
    for span in doc.spans:
        for name in re.findall(r"(?<![\w./:-])(procmesh(?:_orchestrator|_sidecars)?(?:\.\w+)+)", span):
            if re.search(r"\.(json|ya?ml|md|py|sock)$", name):
                continue
            if name.startswith("procmesh.v1."):
                ok = name.split(".")[2] in contract_names()
            else:
                ok = _resolves(name) or re.search(rf"[\"']{re.escape(name)}\b", source_text()) is not None
            if not ok:
                problems.append(
                    f"{_rel(doc.path)}: {name} is no module, name, contract name or span attribute"
                )
        # the OpenTelemetry GenAI attributes the spans carry (`gen_ai.agent.name`): strings too
        for name in re.findall(r"(?<![\w./:-])(gen_ai(?:\.\w+)+)", span):
            if re.search(rf"[\"']{re.escape(name)}[\"']", source_text()) is None:
                problems.append(f"{_rel(doc.path)}: {name} is no span attribute the code writes")
    return problems


# -- members of the faces' classes ---------------------------------------------------------------


@functools.cache
def face_classes() -> dict[str, type]:
    """The classes `procmesh.__all__` and `procmesh_orchestrator.__all__` export, by name."""
    found = {}
    for module in (procmesh, procmesh_orchestrator):
        for name in module.__all__:
            if inspect.isclass(getattr(module, name)):
                found[name] = getattr(module, name)
    return found


@functools.cache
def members(cls: type) -> frozenset[str]:
    """What `Class.name` may name: its attributes, its fields (and their aliases) and what its
    methods assign to `self` (`App.run_ended`, a list made in __init__), its annotated fields."""
    names = set(dir(cls))
    for field_name, field in getattr(cls, "model_fields", {}).items():
        names |= {field_name, field.alias or field_name}
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] not in ("procmesh", "procmesh_orchestrator"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)  # a dataclass's field
    return frozenset(names)


def member_problems(doc: Doc) -> list[str]:
    """Every `Class.member` span (`RunStream.detach()`, `App.run_ended`) whose class a public face
    exports names one of its members."""
    classes = face_classes()
    problems = []
    for span in doc.spans:
        for cls, member in re.findall(r"(?<![\w.])([A-Z]\w*)\.([a-z_]\w*)", span):
            if cls in classes and member not in members(classes[cls]):
                problems.append(f"{_rel(doc.path)}: `{span[:50]}`: {cls} has no {member}")
    return problems


# -- class names ---------------------------------------------------------------------------------

OTHERS = {
    *("EventSource", "PrometheusRule"),  # the browser's SSE client, the Prometheus Operator's resource
    *("chunk_window", "structured_output_options", "worker_threads", "grpc_health_probe"),  # others'
    *("go_package", "java_package", "ef_search"),  # protoc options; pgvector's HNSW setting
    "p9_postgres_100000_recall_ms_p50",  # a result key bench/p9_recall.py composes
    "MY_KEY",  # deploy.md's placeholder for a variable a provider's apiKeyEnv names
}
"""Names the docs give that are other projects' (or composed at run time), not this source's."""


@functools.cache
def defined_names() -> frozenset[str]:
    """Every CamelCase and snake_case word of the repository's source (Python, JavaScript, proto,
    Go, the deploy files: classes, functions, fields, alert names) and Python's builtins. A word, not a
    definition: a name a move deletes leaves the source with it (and parsing every module costs
    seconds this check need not). This module is left out: its made-up document names a class
    nobody defines."""
    names = set(dir(builtins))
    suffixes = (".py", ".js", ".mjs", ".ts", ".proto", ".go", ".yml", ".yaml")
    for folder in ("sdk", "orchestrator", "sidecars", "bench", "tests", "examples", "proto", "deploy"):
        for path in (REPO / folder).rglob("*"):
            if (
                path.suffix in suffixes
                and "node_modules" not in path.parts
                and path != Path(__file__).resolve()
            ):
                names |= set(
                    re.findall(
                        r"\b(?:[A-Z]\w+|[a-z]\w*_\w+)", path.read_text(encoding="utf-8", errors="replace")
                    )
                )
    return frozenset(names)


def name_problems(doc: Doc) -> list[str]:
    """Every span that is one CamelCase, snake_case or UPPER_SNAKE name (`SessionClock`,
    `RunStream(...)`, `fused_items`, `translate_rpc_error`, `MERGE_WINDOW`) is a word of the
    repository's source, or another project's name (`OTHERS`); a `PROCMESH_*` variable is
    test_docs_environment.py's, an `OTEL_*` one OpenTelemetry's."""
    problems = []
    for span in doc.spans:
        found = re.fullmatch(
            r"([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
            r"|(?!PROCMESH_|OTEL_)[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(\(.*\))?",
            span,
        )
        if found and found[1] not in defined_names() and found[1] not in OTHERS:
            problems.append(f"{_rel(doc.path)}: {found[1]} is defined nowhere")
    return problems


def test_names_alone_in_a_span_exist(docs: list[Doc]) -> None:
    assert {"SessionClock", "GrpcHookCaller", "ProcessorService", "ProcmeshSidecarDown"} <= defined_names()
    assert [p for doc in docs for p in name_problems(doc)] == []


# -- python -m -----------------------------------------------------------------------------------


def module_problems(doc: Doc) -> list[str]:
    """Every `python -m MODULE` of ours (our packages, the bench) runs a module that exists."""
    problems = []
    for line in _command_lines(doc):
        for module in re.findall(r"\bpython3? -m ((?:procmesh\w*|bench)(?:\.\w+)*)", line):
            if importlib.util.find_spec(module) is None:
                problems.append(f"{_rel(doc.path)}: python -m {module}: no such module")
    return problems


def test_dotted_names_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in dotted_problems(doc)] == []


def test_members_of_the_faces_classes_exist(docs: list[Doc]) -> None:
    assert {"App", "RunStream", "Processor"} <= set(face_classes())
    assert [p for doc in docs for p in member_problems(doc)] == []


def test_python_m_modules_exist(docs: list[Doc]) -> None:
    assert [p for doc in docs for p in module_problems(doc)] == []


def test_the_checks_catch_made_up_names() -> None:
    fake = made_up(
        "`procmesh._encode.quiet_effects` and `procmesh._chain._quiet`;\n"
        "`procmesh_orchestrator.config.schema` and `procmesh_orchestrator.config.frob`;\n"
        "`procmesh.v1.Hook`, `procmesh.v1.Hooks`; `procmesh.processor.id`, `procmesh.judge.frobs`;\n"
        "`gen_ai.agent.name`, `gen_ai.agent.names`, `gen_ai.usage.input_tokens`;\n"
        "`procmesh.yaml`, `dns:///a.procmesh.svc:1`.\n"
        "`App.run_ended`, `App.start()`, `App.frob()`, `RunStream.detach()`, `CompatRule.frob`.\n\n"
        "```sh\npython -m procmesh_sidecars builtins\npython -m procmesh_sidecars.nothing\n"
        "python -m bench.p9_recall\npython -m venv x\n```\n",
    )
    said = "is no module, name, contract name or span attribute"
    assert dotted_problems(fake) == [
        f"docs/made-up.md: procmesh._chain._quiet {said}",
        f"docs/made-up.md: procmesh_orchestrator.config.frob {said}",
        f"docs/made-up.md: procmesh.v1.Hooks {said}",
        f"docs/made-up.md: procmesh.judge.frobs {said}",
        "docs/made-up.md: gen_ai.agent.names is no span attribute the code writes",
    ]
    assert member_problems(fake) == ["docs/made-up.md: `App.frob()`: App has no frob"]
    assert module_problems(fake) == ["docs/made-up.md: python -m procmesh_sidecars.nothing: no such module"]
    named = made_up(
        "`SessionClock`, `HookAttempts`, `RunStream(x)`, `fused_items`, `quiet_effect`,"
        " `MERGE_WINDOW`, `MERGE_WINDOWS`, `PROCMESH_LISTEN`, `OTEL_SDK_DISABLED`.\n",
    )
    assert name_problems(named) == [
        "docs/made-up.md: HookAttempts is defined nowhere",
        "docs/made-up.md: quiet_effect is defined nowhere",
        "docs/made-up.md: MERGE_WINDOWS is defined nowhere",
    ]
