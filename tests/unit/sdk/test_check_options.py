"""`procmesh-check-sidecar --options [ID=]JSON`: options for every processor, or per processor id."""

from __future__ import annotations

import argparse
import io

import pytest

from procmesh._check.cli import parse_options
from procmesh._check.report import Report
from procmesh._check.wire import Wire


def parse(*values: str) -> tuple[object, object]:
    return parse_options(values, argparse.ArgumentParser(prog="check"))


def test_a_json_object_is_for_every_processor_and_id_json_for_one() -> None:
    assert parse() == (None, {})
    assert parse('{"words": ["x"]}') == ({"words": ["x"]}, {})
    shared, by_id = parse('guard={"words": ["x"]}', "shout={}", '{"n": 1}', ' spaced = {"a": true}')
    assert shared == {"n": 1}
    assert by_id == {"guard": {"words": ["x"]}, "shout": {}, "spaced": {"a": True}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["[1]"], "--options must be a JSON object"),
        (["{oops"], "--options is not JSON nor ID=JSON"),
        (["=1"], "--options is not JSON nor ID=JSON"),
        (["guard=[1]"], "--options guard=...: options must be a JSON object"),
        (["guard={oops"], "--options guard=...: not JSON"),
        (["guard={}", "guard={}"], "processor 'guard' is given options twice"),
        (["{}", "{}"], "options for every processor are given twice"),
    ],
)
def test_malformed_options_are_a_usage_error(
    values: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*values)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_each_processor_gets_its_own_options_and_the_rest_the_shared_ones() -> None:
    wire = Wire(
        "unused", Report(io.StringIO()), options={"shared": 1}, processor_options={"guard": {"words": ["x"]}}
    )
    assert dict(wire.context("guard").options) == {"words": ["x"]}
    assert dict(wire.context("other").options) == {"shared": 1}
