"""deploy/docker/Dockerfile, checked without a Docker engine.

Every COPY source exists and survives .dockerignore, the final stage runs as the non-root user
the manifests expect, and every command the image runs is a console script of pyproject.toml.
"""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from procmesh_orchestrator.cli.pod.plan import IMAGE_ENV
from tests.conftest import REPO
from tests.deploy.support import DISTRIBUTIONS, DOCKERFILE, console_scripts

Instruction = tuple[str, str]


def instructions() -> list[Instruction]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    result: list[Instruction] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        keyword, _, rest = text.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continuation line"
    return result


def stages() -> list[tuple[str, list[Instruction]]]:
    """(stage name, its instructions) per FROM; unnamed stages are named by their index."""
    out: list[tuple[str, list[Instruction]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match is not None, rest
            out.append((match[2] or str(len(out)), [(keyword, match[1])]))
        elif out:
            out[-1][1].append((keyword, rest))
    return out


def dockerignore() -> list[str]:
    """The .dockerignore patterns, in order."""
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _glob(pattern: str, path: str) -> bool:
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.fullmatch(regex, path) is not None


def ignored(path: str) -> bool:
    """Whether the build context leaves `path` out (Docker's rules: the last matching pattern wins,
    and a pattern that matches a parent directory matches everything under it)."""
    result = False
    parts = path.strip("/").split("/")
    for pattern in dockerignore():
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        if any(_glob(body, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            result = not negate
    return result


def test_multi_stage_from_a_pinned_slim_base_without_add() -> None:
    arg = next(rest for keyword, rest in instructions() if keyword == "ARG")
    base = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.\d+-slim-\w+", base), f"pin a slim base by tag, got {base}"
    built = stages()
    assert len(built) >= 2, "a build stage and a final stage"
    assert built[-1][1][0][1] == "${PYTHON_IMAGE}", "the final stage runs on the same slim base"
    assert "ADD" not in {keyword for keyword, _ in instructions()}, "COPY, not ADD"


def test_every_copy_source_exists_and_survives_dockerignore() -> None:
    names: list[str] = []
    copied: set[str] = set()
    for name, body in stages():
        for keyword, rest in body:
            if keyword != "COPY":
                continue
            args = rest.split()
            flags = [a for a in args if a.startswith("--")]
            sources = [a for a in args if not a.startswith("--")][:-1]
            source_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
            if source_stage is not None:
                assert source_stage in names, f"COPY --from={source_stage}: no earlier stage of that name"
                continue
            for source in sources:
                path = REPO / source
                assert path.exists(), f"COPY {source}: not in the repository"
                files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
                assert files, f"COPY {source}: nothing to copy"
                for file in files:
                    relative = file.relative_to(REPO).as_posix()
                    assert not ignored(relative), f"COPY {source}: .dockerignore leaves out {relative}"
                copied.add(source.rstrip("/"))
        names.append(name)
    # Everything the three distributions build from is copied.
    needed: set[str] = set()
    for folder in DISTRIBUTIONS:
        with open(REPO / folder / "pyproject.toml", "rb") as f:
            meta = tomllib.load(f)
        needed |= {f"{folder}/{p}" for p in ("pyproject.toml", meta["project"]["readme"])}
        needed |= {f"{folder}/{p}" for p in meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]}
    assert needed <= copied, f"not copied: {sorted(needed - copied)}"


def test_dockerignore_keeps_the_context_small() -> None:
    for path in (
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        "sdk/node/package.json",
        "bench/x.py",
    ):
        assert ignored(path), f"{path} should not be in the build context"
    for path in (
        "orchestrator/procmesh_orchestrator/app.py",
        "sidecars/procmesh_sidecars/examples.py",
        "sdk/procmesh/_run.py",
        "sidecars/pyproject.toml",
    ):
        assert not ignored(path), path
    assert ignored("orchestrator/procmesh_orchestrator/__pycache__/app.cpython-311.pyc")
    assert ignored("pyproject.toml")  # the workspace root holds only tool configuration


def test_the_final_stage_runs_non_root_without_build_tools() -> None:
    final = stages()[-1][1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert re.fullmatch(r"[1-9]\d*", uid), "a numeric non-root USER (runAsNonRoot can check it)"
    assert re.fullmatch(r"[1-9]\d*", gid), "a numeric non-root group"
    for keyword, rest in final:
        if keyword == "RUN":
            assert not re.search(r"apt-get install|apk add|gcc|build-essential|pip install", rest), rest
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert dict(re.findall(r"(\w+)=(\S+)", env)).items() >= IMAGE_ENV.items(), (
        "cli.pod.plan.IMAGE_ENV mirrors ENV"
    )
    assert "PATH=/opt/procmesh/bin:" in env


def test_every_command_the_image_runs_is_a_console_script() -> None:
    scripts = console_scripts()
    commands = [rest for keyword, rest in instructions() if keyword in ("CMD", "ENTRYPOINT")]
    assert commands
    for command in commands:
        argv = json.loads(command)  # exec form: SIGTERM reaches the program, not a shell
        assert argv[0] in scripts, argv


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [("*", "sdk", True), ("*", "sdk/x", False), ("**/*.pyc", "a/b/c.pyc", True), ("**/*.pyc", "c.pyc", True)],
)
def test_the_dockerignore_glob(pattern: str, path: str, expected: bool) -> None:
    assert _glob(pattern, path) is expected
