"""A listing command's ``--limit`` (`memory threads`, `runs decisions --since`): the same range
check and the same refusal. Each reads one more than the limit, so that a list cut at it says so
on stderr instead of passing for the whole (`service.api.decisions.between_page` for decisions)."""

from __future__ import annotations

import sys


def limit_refused(command: str, limit: int, most: int) -> bool:
    """Whether `limit` is outside 1 to `most` (one fewer than the store reads at once, so that the
    one more fits), said on stderr: the command exits 2 then."""
    if 1 <= limit <= most:
        return False
    print(f"procmesh {command}: --limit must be from 1 to {most}", file=sys.stderr, flush=True)
    return True
