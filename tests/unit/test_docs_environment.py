"""The one list of procmesh's PROCMESH_* variables (`procmesh.environment`) is true: each
component's set is what its code reads (the settings classes, the Node SDK's flags, the literals
of the product's source), the Node SDK's and the Go example's copies are equal, every variable is
documented on its component's page and the table of docs/running.md names no variable outside the
list."""

from __future__ import annotations

import json
import re

import pytest

from procmesh import ProcessorSettings
from procmesh.environment import COMPONENTS, PREFIX, PREFIXES, RENAMED, check_environment
from procmesh_orchestrator import OrchestratorSettings
from tests.conftest import REPO

NAME = re.compile(r"PROCMESH_[A-Z0-9_]*[A-Z0-9]")

PRODUCT_SOURCES = ("sdk/procmesh", "sdk/node/lib", "sdk/node/scripted", "orchestrator", "sidecars", "bench")
"""What ships or is run against it: every PROCMESH_ name these read must be on the list (tests/
name made-up and config-named variables of their own), as must the Makefile's and the Go
example's (examples/go/*.go; its build/ holds generated code only)."""

PAGES = {
    "orchestrator": ("docs/running.md", "docs/service.md"),
    "cli": ("docs/running.md",),
    "python-sidecar": ("docs/running.md", "sdk/README.md"),
    "node-sidecar": ("docs/running.md", "sdk/node/README.md"),
    "development": ("docs/running.md",),
}
"""Where each component's variables are documented (docs/running.md's table lists them all)."""


def _fields(settings: type[OrchestratorSettings] | type[ProcessorSettings]) -> set[str]:
    return {f"{PREFIX}{name}".upper() for name in settings.model_fields}


def _stem(name: str, component: str) -> bool:
    """`name` is one of `component`'s prefixes as the pattern finds it (``PROCMESH_TEST`` of
    ``PROCMESH_TEST_*``, ``PROCMESH_CONFIG`` of ``PROCMESH_CONFIG__*``)."""
    return any(prefix.rstrip("_") == name for prefix in PREFIXES.get(component, ()))


def _known(name: str) -> bool:
    return any(
        name in names or name.startswith(PREFIXES.get(c, ())) or _stem(name, c)
        for c, names in COMPONENTS.items()
    )


def test_the_python_components_are_their_settings_classes() -> None:
    assert set(COMPONENTS["orchestrator"]) == _fields(OrchestratorSettings) | {"PROCMESH_LOG_FORMAT"}
    assert set(COMPONENTS["python-sidecar"]) == _fields(ProcessorSettings)


def test_the_node_component_is_its_flags_and_the_variables_its_library_reads() -> None:
    lib = REPO / "sdk" / "node" / "lib"
    table = (lib / "settings.js").read_text().split("const FLAGS = [", 1)[1].split("\n];", 1)[0]
    flags = re.findall(r"^\s*\['--([a-z-]+)'", table, re.MULTILINE)
    assert "metrics-port" in flags
    from_flags = {f"PROCMESH_{flag.replace('-', '_').upper()}" for flag in flags}
    literals = {n for path in lib.glob("*.js") for n in NAME.findall(path.read_text())}
    assert set(COMPONENTS["node-sidecar"]) == from_flags | literals


@pytest.mark.parametrize("path", ["sdk/node/lib/environment.json", "examples/go/environment.json"])
def test_the_node_sdks_and_the_go_examples_copies_are_equal(path: str) -> None:
    copy = json.loads((REPO / path).read_text())
    assert copy["components"] == {c: sorted(names) for c, names in COMPONENTS.items()}
    assert copy["prefixes"] == {c: list(p) for c, p in PREFIXES.items()}
    assert copy["renamed"] == dict(RENAMED)


def test_every_variable_the_product_reads_is_on_the_list() -> None:
    unlisted = set()
    for folder in PRODUCT_SOURCES:
        for path in (REPO / folder).rglob("*"):
            if path.suffix in {".py", ".js", ".mjs"} and "node_modules" not in path.parts:
                unlisted |= {n for n in NAME.findall(path.read_text()) if not _known(n)}
    for path in [REPO / "Makefile", *(REPO / "examples" / "go").glob("*.go")]:
        unlisted |= {n for n in NAME.findall(path.read_text()) if not _known(n)}
    assert unlisted - set(RENAMED) == set()


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_variable_is_documented_on_its_components_pages(component: str) -> None:
    missing = [
        f"{page}: {name}"
        for page in PAGES[component]
        for name in sorted(COMPONENTS[component])
        if not re.search(rf"{name}(?![A-Z0-9_])", (REPO / page).read_text())
    ]
    assert missing == []


def _running_table() -> dict[str, set[str]]:
    """docs/running.md's table of variables: component -> the names its row lists."""
    text = (REPO / "docs" / "running.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0].strip("`") in COMPONENTS:
            component = cells[0].strip("`")
            rows[component] = {n for n in NAME.findall(cells[1]) if not _stem(n, component)}
    return rows


def test_the_table_in_running_md_is_the_list() -> None:
    assert _running_table() == {c: set(names) for c, names in COMPONENTS.items()}


def test_a_typo_is_unknown_with_the_closest_name_and_another_components_variable_is_foreign() -> None:
    env = {"PROCMESH_API_KEY": "k", "PROCMESH_LISTEN": "x", "PROCMESH_HTTP_PORT": "1", "HOME": "/"}
    check = check_environment("orchestrator", env)
    assert check.unknown == ("PROCMESH_API_KEY",)
    assert check.foreign == ("PROCMESH_LISTEN",)
    assert "PROCMESH_API_KEY (did you mean PROCMESH_API_KEYS?)" in (check.error() or "")
    sidecar = check_environment("python-sidecar", env)
    assert sidecar.foreign == ("PROCMESH_HTTP_PORT",)
    assert "PROCMESH_LISTEN" in (check.note() or "")
    named = check_environment("orchestrator", {"PROCMESH_STORE_DSN": "x"}, also={"PROCMESH_STORE_DSN"})
    assert named.unknown == named.foreign == ()
    old = check_environment("python-sidecar", {"PROCMESH_CONFIG": "c.yaml"})
    assert "PROCMESH_CONFIG (renamed PROCMESH_CONFIG_FILE)" in (old.error() or "")
    assert check_environment("cli", {"PROCMESH_CONFIG__AGENTS__A__MAX_STEPS": "3"}).unknown == ()
    assert check_environment("node-sidecar", {"PROCMESH_CONFIG__AGENTS": "x"}).foreign == (
        "PROCMESH_CONFIG__AGENTS",
    )
