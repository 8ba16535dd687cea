"""proto/README.md's `protoc` lines, run as the page shows them, and the stubs they make built.

Each runs with bash in a fresh folder holding a `proto` link to the repository's contract. Go's
stubs are then compiled offline (GOPATH mode, as examples/go/build.sh); C++'s are compiled by the
snippet's own `g++` line against Debian's gRPC; Python's are byte-compiled. Java's are generated
only: grpc-java's jars are not packaged for this machine (the page says so).
"""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.deps import require, require_sources
from tests.fixtures.snippets import snippet

pytestmark = pytest.mark.e2e

PAGE = "proto/README.md"


def run_snippet(name: str, work: Path, env: dict[str, str] | None = None) -> None:
    (work / "proto").symlink_to(REPO / "proto")
    proc = subprocess.run(
        ["bash", "-euc", snippet(PAGE, name)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def generated(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_go_line_makes_stubs_that_build(tmp_path: Path) -> None:
    for tool in ("protoc", "protoc-gen-go", "protoc-gen-go-grpc", "go"):
        require(tool)
    require_sources()
    run_snippet("protoc-go", tmp_path)
    pkg = tmp_path / "gen" / "go" / "example.com" / "gen" / "procmeshv1"
    assert generated(pkg) == ["processor.pb.go", "processor_grpc.pb.go", "types.pb.go"]
    gopath = tmp_path / "gopath"
    shutil.copytree(tmp_path / "gen" / "go", gopath / "src")
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{gopath}:/usr/share/gocode",
        "GOFLAGS": "",
        "GOCACHE": str(REPO / "examples" / "go" / "build" / "cache"),
    }
    build = subprocess.run(
        ["go", "vet", "example.com/gen/procmeshv1"], env=env, capture_output=True, text=True, timeout=240
    )
    assert build.returncode == 0, build.stderr


def test_the_cpp_lines_make_stubs_that_compile(tmp_path: Path) -> None:
    for tool in ("protoc", "grpc_cpp_plugin", "g++", "pkg-config"):
        require(tool)
    require_sources()  # libgrpc++-dev's headers
    run_snippet("protoc-cpp", tmp_path)
    assert generated(tmp_path / "gen" / "cpp" / "procmesh" / "v1") == [
        f"{name}{ext}"
        for name in ("processor", "types")
        for ext in (".grpc.pb.cc", ".grpc.pb.h", ".pb.cc", ".pb.h")
    ]
    objects = sorted(p.name for p in tmp_path.glob("*.o"))
    assert objects == ["processor.grpc.pb.o", "processor.pb.o", "types.grpc.pb.o", "types.pb.o"]
    assert all((tmp_path / o).stat().st_size > 0 for o in objects)


def test_the_java_line_generates_the_service_and_messages(tmp_path: Path) -> None:
    for tool in ("protoc", "grpc_java_plugin"):
        require(tool)
    run_snippet("protoc-java", tmp_path)
    java = tmp_path / "gen" / "java" / "procmesh" / "v1"
    assert generated(java) == ["Processor.java", "ProcessorServiceGrpc.java", "Types.java"]
    grpc = (java / "ProcessorServiceGrpc.java").read_text()
    assert "public static abstract class ProcessorServiceImplBase" in grpc
    assert "processOutputStream" in grpc


def test_the_python_line_generates_importable_stubs(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    # `pip install grpcio-tools` finds it installed in the project's venv (no download).
    run_snippet("protoc-python", tmp_path, env={**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}"})
    out = tmp_path / "gen" / "python" / "procmesh" / "v1"
    assert generated(out) == [
        "processor_pb2.py",
        "processor_pb2_grpc.py",
        "types_pb2.py",
        "types_pb2_grpc.py",
    ]
    for path in out.iterdir():
        py_compile.compile(str(path), doraise=True)
    assert "class ProcessorServiceServicer" in (out / "processor_pb2_grpc.py").read_text()
