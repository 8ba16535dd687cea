"""The oldest versions the docs say procmesh needs are the ones its packaging and tests hold it to:
every "Python 3.X or newer" (or "3.X+", "needs Python 3.X") is the three distributions'
`requires-python`, every "Node.js N or newer" the Node SDK's `engines.node`, every "kubectl 1.N or
newer" the floor `procmesh pod` checks (`cli/pod/manifests.py`), every "Kubernetes 1.N or newer"
(or ">= 1.N") the oldest version tests/deploy validates the manifests against, and every
"`@mastra/client-js` 1.N" (what the HTTP API is written and measured against) the version
tests/clientjs pins, the real client the e2e tests run.

A floor raised in one place and not the other leaves a reader installing what cannot run it.
`test_the_check_catches_made_up_versions` feeds the check a made-up page.
"""

from __future__ import annotations

import json
import re
import tomllib

from tests.conftest import REPO
from tests.unit.doc_pages import DOCS, Doc, _rel, made_up

SAID = {
    "Python": r"(?:needs |need )?Python (3\.\d+)(?:\+| or newer| or later)",
    "Node.js": r"Node\.js (\d+) or newer",
    "kubectl": r"kubectl`?\s+(1\.\d+)(?:\+| or newer)",
    "Kubernetes": r"Kubernetes (?:\*\*)?(?:>= ?)?(1\.\d+)(?: or newer)?",
    "@mastra/client-js": r"@mastra/client-js`? (\d+\.\d+)",
}


def floors() -> dict[str, str]:
    """Each tool's oldest supported version, read from where it is enforced."""
    from procmesh_orchestrator.cli.pod import manifests
    from tests.deploy.test_manifests import KUBERNETES_VERSIONS

    pythons = {
        tomllib.loads((REPO / d / "pyproject.toml").read_text())["project"]["requires-python"]
        for d in ("sdk", "orchestrator", "sidecars")
    }
    assert len(pythons) == 1, pythons  # one floor for the three distributions
    node = json.loads((REPO / "sdk" / "node" / "package.json").read_text())["engines"]["node"]
    kubectl = re.search(r"kubectl (1\.\d+) or newer", manifests.KUBECTL_HINT)
    assert kubectl is not None
    clientjs = json.loads((REPO / "tests" / "clientjs" / "package.json").read_text())["dependencies"]
    return {
        "Python": pythons.pop().removeprefix(">="),
        "Node.js": node.removeprefix(">="),
        "kubectl": kubectl[1],
        "Kubernetes": KUBERNETES_VERSIONS[0].rsplit(".", 1)[0],
        "@mastra/client-js": clientjs["@mastra/client-js"].rsplit(".", 1)[0],
    }


def version_problems(doc: Doc, floor: dict[str, str]) -> list[str]:
    """Every version floor the page states that is not the enforced one."""
    text = " ".join(doc.text.split())
    return [
        f"{_rel(doc.path)}: {tool} {said} said, {floor[tool]} enforced"
        for tool, pattern in SAID.items()
        for said in re.findall(pattern, text)
        if said != floor[tool]
    ]


def test_the_versions_the_docs_state_are_the_enforced_floors() -> None:
    floor = floors()
    assert all(re.fullmatch(r"\d+(\.\d+)?", v) for v in floor.values()), floor  # each floor was read
    stated = [m for doc in map(Doc.parse, DOCS) for p in SAID.values() for m in re.findall(p, doc.text)]
    assert len(stated) >= 6  # the statements were found
    assert [p for doc in map(Doc.parse, DOCS) for p in version_problems(doc, floor)] == []


def test_the_check_catches_made_up_versions() -> None:
    page = made_up(
        "Needs Python 3.10 or newer (or `python3.12+`), Node.js 18 or newer, `kubectl`\n1.25+ and\n"
        "Kubernetes **1.29 or newer**; Node 22 from npm is the tests' own; `@mastra/client-js` 1.40.\n"
    )
    assert version_problems(page, floors()) == [
        "docs/made-up.md: Python 3.10 said, 3.11 enforced",
        "docs/made-up.md: Node.js 18 said, 20 enforced",
        "docs/made-up.md: kubectl 1.25 said, 1.27 enforced",
        "docs/made-up.md: Kubernetes 1.29 said, 1.30 enforced",
        "docs/made-up.md: @mastra/client-js 1.40 said, 1.47 enforced",
    ]
