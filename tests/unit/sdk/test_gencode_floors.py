"""The committed gencode's version stamps must not exceed the SDK's declared dependency floors.

gRPC gencode refuses to import on a grpcio older than GRPC_GENERATED_VERSION, and protobuf
gencode refuses a runtime older than its stamp (or of another major). An install resolved to
exactly the floors of sdk/pyproject.toml must therefore satisfy both stamps.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from procmesh.v1 import processor_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
GEN = REPO / "sdk" / "procmesh" / "v1"
_PROTOBUF_STAMP = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),"
)


def floor(package: str) -> Version:
    deps = tomllib.loads((REPO / "sdk" / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        if req.name == package:
            floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
            assert len(floors) == 1, f"{dep!r} must have exactly one >= floor"
            return floors[0]
    raise AssertionError(f"{package} is not a dependency of procmesh-sdk")


def test_grpc_gencode_version_is_at_most_the_grpcio_floor() -> None:
    generated = Version(processor_pb2_grpc.GRPC_GENERATED_VERSION)
    assert generated <= floor("grpcio"), (
        f"gencode needs grpcio>={generated} but sdk/pyproject.toml allows grpcio>={floor('grpcio')}"
    )


def test_grpc_gencode_constant_is_read_from_the_committed_file() -> None:
    text = (GEN / "processor_pb2_grpc.py").read_text()
    assert f"GRPC_GENERATED_VERSION = '{processor_pb2_grpc.GRPC_GENERATED_VERSION}'" in text


@pytest.mark.parametrize("module", ["processor_pb2.py", "types_pb2.py"])
def test_protobuf_gencode_matches_the_protobuf_floor(module: str) -> None:
    match = _PROTOBUF_STAMP.search((GEN / module).read_text())
    assert match, f"no ValidateProtobufRuntimeVersion stamp in {module}"
    stamped = Version(".".join(match.groups()))
    protobuf_floor = floor("protobuf")
    assert stamped.major == protobuf_floor.major, f"{module} is protobuf {stamped}, floor {protobuf_floor}"
    assert stamped <= protobuf_floor, f"{module} needs protobuf>={stamped}, floor is {protobuf_floor}"
