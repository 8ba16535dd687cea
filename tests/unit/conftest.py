"""Fixtures of the unit tier's modules that share them."""

from __future__ import annotations

import pytest

from tests.unit.doc_pages import DOCS, Doc


@pytest.fixture(scope="session")
def docs() -> list[Doc]:
    """Every documentation page the `test_docs_*` modules check, parsed once."""
    return [Doc.parse(path) for path in DOCS]
