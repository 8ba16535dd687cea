"""The docs name only members that exist: every `Class.member` in a code span whose class one of
our packages defines (`GrpcHookCaller.send`, `Run._after_step`, `Attempt.commit`) names a method
or attribute of it or of its bases there, and every `XService.Method` (`ModelService.GenerateBatch`)
names an RPC of that service of the contract.

test_docs_names.py checks such members only for the classes the public faces export; the
architecture and operations pages cite internal classes' members, which a refactor renames (e50f558
folded AttemptCaller's overrides into one `on_call`). The truth is the packages' source (each
class's functions, assignments and annotated fields, read with `ast`, no import) and the generated
descriptors. `test_the_checks_catch_made_up_members` feeds the checks a made-up document.
"""

from __future__ import annotations

import ast
import functools
import re

from procmesh.v1 import agent_pb2, model_pb2, processor_pb2, types_pb2
from tests.conftest import REPO
from tests.unit.doc_pages import Doc, _rel, made_up
from tests.unit.test_docs_names import contract_names

SOURCES = ("sdk/procmesh", "orchestrator/procmesh_orchestrator", "sidecars/procmesh_sidecars")

HISTORY = {"bench/README.md"}
"""Pages that record figures measured at past commits and name code as it was then (`Hosted.observe`
before the batch's tally replaced it): not checked."""

# -- classes of our packages -----------------------------------------------------------------------


@functools.cache
def class_members() -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """Each class our packages define, by name: its members and its bases' names (a name defined
    twice, in two modules, gets the union of both)."""
    found: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
    for folder in SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            if "v1" in path.relative_to(REPO / folder).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef):
                    continue
                names: set[str] = set()
                for sub in ast.walk(node):
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(sub.name)
                    elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        names.add(sub.attr)  # self.x = ... in a method
                    elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                        names.add(sub.target.id)  # a field
                    elif isinstance(sub, ast.Assign):
                        names |= {t.id for t in sub.targets if isinstance(t, ast.Name)}
                bases = tuple(ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases)
                old_names, old_bases = found.get(node.name, (frozenset(), ()))
                found[node.name] = (old_names | names, old_bases + bases)
    return found


def has_member(cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool | None:
    """Whether our class `cls` (or one of its bases we define) has `member`; None when a base is
    another library's (its members are not read here: not checked)."""
    names, bases = class_members()[cls]
    if member in names:
        return True
    answers = [
        has_member(base, member, seen | {cls}) if base in class_members() and base not in seen else None
        for base in bases
        if base not in ("object", "Protocol", "Generic")
    ]
    return None if None in answers else any(answers)


def member_problems(doc: Doc) -> list[str]:
    """Every `Class.member` span of a class we define (and the contract does not: those are
    test_docs_proto.py's) names one of its members; a camelCase member is another API's spelling
    (the reference's `CompatRule.applyToPrompt`) and is not checked."""
    problems = []
    for span in doc.spans:
        for cls, member in re.findall(r"(?<![\w.])([A-Z]\w*)\.([a-z_][a-z0-9_]*)\b(?!\.)", span):
            if cls in class_members() and cls not in contract_names() and has_member(cls, member) is False:
                problems.append(f"{_rel(doc.path)}: `{span[:50]}`: {cls} has no {member}")
    return problems


# -- the contract's services -----------------------------------------------------------------------


@functools.cache
def rpcs() -> dict[str, frozenset[str]]:
    """Each service of the contract, by name, and its RPCs."""
    return {
        name: frozenset(m.name for m in service.methods)
        for module in (agent_pb2, model_pb2, processor_pb2, types_pb2)
        for name, service in module.DESCRIPTOR.services_by_name.items()
    }


def rpc_problems(doc: Doc) -> list[str]:
    """Every `XService.Method` the page writes outside code blocks names an RPC of the service
    (a code block's `ProcessorService.service` is grpc-js's, not an RPC)."""
    prose = re.sub(r"^```.*?^```", "", doc.text, flags=re.M | re.S)
    return [
        f"{_rel(doc.path)}: {service} has no RPC {method}"
        for service, method in sorted(set(re.findall(r"\b(\w+Service)\.([A-Za-z]\w*)", prose)))
        if service in rpcs() and method not in rpcs()[service]
    ]


# -- the tests -------------------------------------------------------------------------------------


def test_members_of_our_classes_exist(docs: list[Doc]) -> None:
    checked = [doc for doc in docs if _rel(doc.path) not in HISTORY]
    assert has_member("GrpcHookCaller", "send")  # the source was read
    assert [p for doc in checked for p in member_problems(doc)] == []


def test_rpcs_named_in_the_docs_exist(docs: list[Doc]) -> None:
    assert "GenerateBatch" in rpcs()["ModelService"]
    assert [p for doc in docs for p in rpc_problems(doc)] == []


def test_the_checks_catch_made_up_members() -> None:
    doc = made_up(
        "`GrpcHookCaller.send`, `GrpcHookCaller.stream_all`, `Run._after_step`, `Run._after_steps`,"
        " `SessionClock.frob`, `CompatRule.applyToPrompt`, `HookEffects.request_context_updates`.\n\n"
        "`ModelService.GenerateBatch`, `ModelService.ReportSave`, `AgentService.Observe`.\n\n"
        "```js\nserver.addService(ProcessorService.service, impl);\n```\n"
    )
    assert member_problems(doc) == [
        "docs/made-up.md: `GrpcHookCaller.stream_all`: GrpcHookCaller has no stream_all",
        "docs/made-up.md: `Run._after_steps`: Run has no _after_steps",
        "docs/made-up.md: `SessionClock.frob`: SessionClock has no frob",
    ]
    assert rpc_problems(doc) == ["docs/made-up.md: ModelService has no RPC ReportSave"]
