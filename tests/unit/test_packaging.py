"""Packaging: one license, one version, and the metadata a package index shows, the same everywhere.

The three Python distributions and the Node SDK read their version from one file
(sdk/procmesh/_version.py: hatch's dynamic version; package.json is held to it here), carry the
Apache-2.0 LICENSE, and name the same project URLs.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest

import procmesh
from tests.conftest import REPO

DISTRIBUTIONS = ("sdk", "orchestrator", "sidecars")
VERSION_FILE = REPO / "sdk" / "procmesh" / "_version.py"
LICENSE = REPO / "LICENSE"


def pyproject(folder: str) -> dict[str, Any]:
    with open(REPO / folder / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def package_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "sdk" / "node" / "package.json").read_text(encoding="utf-8"))
    return data


def test_the_license_is_the_apache_2_text_and_every_package_ships_it() -> None:
    text = LICENSE.read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    # Each distribution is built from its own folder, so each holds a copy; they must not drift.
    for folder in (*DISTRIBUTIONS, "sdk/node"):
        assert (REPO / folder / "LICENSE").read_text(encoding="utf-8") == text, folder
    assert "LICENSE" in package_json()["files"]


@pytest.mark.parametrize("folder", DISTRIBUTIONS)
def test_every_distribution_declares_license_urls_and_classifiers(folder: str) -> None:
    project = pyproject(folder)["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert {"Homepage", "Repository", "Documentation", "Issues"} <= project["urls"].keys()
    assert project["urls"] == pyproject("sdk")["project"]["urls"]
    classifiers = project["classifiers"]
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert f"Programming Language :: Python :: {project['requires-python'].removeprefix('>=')}" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression says it"
    assert ("Typing :: Typed" in classifiers) == (folder == "sdk")  # only the SDK ships py.typed


@pytest.mark.parametrize("folder", DISTRIBUTIONS)
def test_every_distribution_reads_its_version_from_the_one_file(folder: str) -> None:
    data = pyproject(folder)
    assert "version" not in data["project"]
    assert data["project"]["dynamic"] == ["version"]
    assert (REPO / folder / data["tool"]["hatch"]["version"]["path"]).resolve() == VERSION_FILE


def test_the_pins_and_the_node_sdk_follow_that_version() -> None:
    version = procmesh.__version__
    assert VERSION_FILE.read_text(encoding="utf-8") == f'__version__ = "{version}"\n'
    major_minor = ".".join(version.split(".")[:2])
    for folder in ("orchestrator", "sidecars"):
        pins = [
            d
            for d in pyproject(folder)["project"]["dependencies"]
            if re.match(r"procmesh-(sdk|sidecars)\b", d)
        ]
        assert pins
        assert all(pin.endswith(f"=={major_minor}.*") for pin in pins), pins
    node = package_json()
    assert node["version"] == version
    assert node["license"] == "Apache-2.0"
    repository = pyproject("sdk")["project"]["urls"]["Repository"]
    assert node["repository"]["url"] == f"git+{repository}.git"
    assert node["bugs"]["url"] == pyproject("sdk")["project"]["urls"]["Issues"]


def test_the_sdk_readme_is_a_package_page() -> None:
    # PyPI shows sdk/README.md alone: a relative link there leads nowhere.
    readme = (REPO / "sdk" / "README.md").read_text(encoding="utf-8")
    assert pyproject("sdk")["project"]["readme"] == "README.md"
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert links
    assert [link for link in links if not re.match(r"https?://", link)] == []
    for heading in (
        "## A processor in twenty lines",
        "## Test it like",
        "## Check any sidecar",
        "## License",
    ):
        assert heading in readme
    # not on PyPI (yet): the page says how to install from a checkout, and clones the real repository
    assert "pip install procmesh-sdk" not in readme
    assert "pip install ./sdk" in readme
    assert f"git clone {pyproject('sdk')['project']['urls']['Repository']}" in readme


async def test_the_sdk_readme_examples_run() -> None:
    # The processor example defines a Processor; the test example passes against it, over gRPC.
    readme = (REPO / "sdk" / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    first = blocks[0]
    (second,) = [b for b in blocks if "async def test_it_serves" in b]
    namespace: dict[str, Any] = {}
    exec(compile(first.replace('if __name__ == "__main__":', "if False:"), "README", "exec"), namespace)
    assert isinstance(namespace["NoSecrets"](), procmesh.Processor)
    exec(compile(second, "README", "exec"), namespace)
    await namespace["test_it_serves"]()
