"""What the repository's files cite outside the doc pages exists: a comment of the deployment files,
the examples, the Makefile and the CI script that names a repository path (`tests/deploy/
test_environment.py`, `docs/operations.md#alerts`, `alerts.test.yml` beside it) names a file that
is there, and its anchor a heading of it; and any tracked text file (code, manifests, the pages)
that cites a page's section by name (`docs/running.md, "Environment variables"`) cites a heading
or a bold paragraph lead (`**One judge call per text.**`) that page has.

test_docs_paths.py checks the pages' own paths and links; these citations sit in YAML and shell
comments and in docstrings, where a renamed test or a retitled section left them pointing at
nothing. `test_the_checks_catch_made_up_citations` feeds both checks made-up files.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.unit.test_docs_paths import slugs

COMMENTED = ("deploy/", "examples/", "Makefile", ".ci/", "proto/buf.yaml", ".dockerignore")
"""Where a comment may cite a path: files that are no page and no Python module."""

_PATH = re.compile(
    r"(?<![\w./:-])((?:[\w.-]+/)*[\w.-]+\.(?:py|md|yml|yaml|sh|mjs|js|toml|proto|go))(?:#([\w-]+))?(?![\w/])"
)
"""A relative path with a file suffix (`a/b.py`, `alerts.yml`), with its `#anchor`; an absolute
path (`/etc/procmesh/config.yaml`, a container's) and a URL's path are not the repository's."""

_SECTION = re.compile(r"([\w./-]+\.md)`?,? \"([^\"]+)\"")


def tracked(*prefixes: str) -> list[Path]:
    """The tracked files under `prefixes` (all when none): what the tree holds."""
    names = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--", *prefixes], capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in names]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None


def comment_path_problems(path: Path, text: str) -> list[str]:
    """Every path a `#` comment (`//` in Go) of `path` names exists: from the repository's root,
    beside the file, or from a folder above it (`base/config.yaml` from an overlay)."""
    marker = "//" if path.suffix == ".go" else "#"
    problems = []
    for line in text.splitlines():
        if marker not in line:
            continue
        comment = line.split(marker, 1)[1]
        beside: list[Path] = []  # `a/test_x.py and test_y.py`: the second beside the first
        for name, anchor in _PATH.findall(comment):
            folders = [*beside, *(folder for folder in path.parents if folder.is_relative_to(REPO))]
            found = next((p for p in [REPO / name, *(f / name for f in folders)] if p.is_file()), None)
            beside = [found.parent] if found is not None else beside
            rel = path.relative_to(REPO)
            if found is None:
                problems.append(f"{rel}: a comment names {name}, which does not exist")
            elif anchor and found.suffix == ".md" and anchor not in slugs(found.read_text(encoding="utf-8")):
                problems.append(f"{rel}: a comment names {name}#{anchor}: no such heading")
    return problems


def sections(text: str) -> set[str]:
    """A page's section names: its headings, and the bold leads of its paragraphs (`**Lead.**`)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    headings = {h.replace("`", "") for h in re.findall(r"^#{1,6} +(.+?) *#*$", prose, flags=re.M)}
    leads = {
        lead.replace("`", "") for lead in re.findall(r"^(?:- )?\*\*([^*]+?)[.:]?\*\*", prose, flags=re.M)
    }
    return headings | leads


def section_problems(path: Path, text: str) -> list[str]:
    """Every `PAGE.md, "Section"` the file cites names a section of that page."""
    problems = []
    for page, cited in _SECTION.findall(text):
        section = re.sub(r"\s+(?:(?://|#|\*)\s+)?", " ", cited)  # wrapped in a comment
        target = REPO / page if (REPO / page).is_file() else path.parent / page
        if not target.is_file():
            continue  # another repository's page, or a path the path checks report
        if section not in sections(target.read_text(encoding="utf-8")):
            problems.append(f'{path.relative_to(REPO)}: cites {page}, "{section}": no such section')
    return problems


def test_paths_in_comments_exist() -> None:
    files = tracked(*COMMENTED)
    assert any(p.name == "deployment.yaml" for p in files)  # the files were found
    problems = [
        p for path in files if (text := _text(path)) is not None for p in comment_path_problems(path, text)
    ]
    assert problems == []


def test_cited_sections_exist() -> None:
    files = [
        p
        for p in tracked()
        if "/v1/" not in p.as_posix() and "node_modules" not in p.parts and p != Path(__file__).resolve()
    ]  # this module's made-up citations aside
    cited = [(path, text) for path in files if (text := _text(path)) is not None and _SECTION.search(text)]
    assert len(cited) >= 5  # the citations were found (deployment.yaml, sdk/README.md, ...)
    assert [p for path, text in cited for p in section_problems(path, text)] == []


def test_the_checks_catch_made_up_citations() -> None:
    yaml = REPO / "deploy" / "k8s" / "overlays" / "prod" / "made-up.yaml"
    text = (
        "# from base/config.yaml; tests/deploy/test_environment.py, tests/deploy/test_gone.py\n"
        "# docs/operations.md#alerts and docs/operations.md#no-such-heading; /etc/procmesh/none.yaml\n"
        "key: value  # https://example.com/a/b.yaml, alerts.yml\n"
    )
    assert comment_path_problems(yaml, text) == [
        "deploy/k8s/overlays/prod/made-up.yaml: a comment names tests/deploy/test_gone.py, "
        "which does not exist",
        "deploy/k8s/overlays/prod/made-up.yaml: a comment names docs/operations.md#no-such-heading: "
        "no such heading",
        "deploy/k8s/overlays/prod/made-up.yaml: a comment names alerts.yml, which does not exist",
    ]
    page = REPO / "sdk" / "made-up.py"
    cites = (
        '"""See docs/running.md, "Environment variables", docs/builtins.md, "One judge call per text",\n'
        'and docs/running.md, "Environment settings"."""\n'
    )
    assert section_problems(page, cites) == [
        'sdk/made-up.py: cites docs/running.md, "Environment settings": no such section',
    ]
