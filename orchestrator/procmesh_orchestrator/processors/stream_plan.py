"""How an output lane's sessions become the output pipeline's stages (`stream.OutputPipeline`):
which processors may share a fused session, and which sessions run as one speculative group."""

from __future__ import annotations

from collections.abc import Sequence

from procmesh_orchestrator.processors.lanes import ProcessorHandle


def may_follow(session: Sequence[ProcessorHandle], handle: ProcessorHandle) -> bool:
    """Whether `handle` may join a fused session after `session`'s processors.

    A fused processor whose hook fails passes later parts by inside the sidecar, so the ones
    after it see those parts even when its policy (fail-closed) ends the run: only a speculative
    processor may get parts that could still be withdrawn, unless every one before it fails open.
    """
    return handle.speculative or all(m.on_failure == "fail-open" for m in session)


Plan = tuple[list[list[ProcessorHandle]], bool | None]
"""A planned stage: its sessions (each one processor, or several fused) and whether it is a
parallel branch whose output is not picked; None: a speculative group of those sessions."""


def speculative_groups(sessions: list[tuple[list[ProcessorHandle], bool]]) -> list[Plan]:
    """Join runs of two or more sessions whose processors are all speculative into groups.

    Shadow processors and parallel branches keep their own session, and a processor id joins a
    group once (a group's members each hold their own state). Cheap first: a judged session
    (`ProcessorHandle.judged`) does not join a group of cheap ones, so it is given each part only
    once the cheap checks in front of it let it by: a part they abort on never reaches a judge,
    nor does a part they rewrite reach one twice (a group would rewind the judge to it)."""
    out: list[tuple[list[list[ProcessorHandle]], bool | None]] = []
    run: list[list[ProcessorHandle]] = []

    def close_run() -> None:
        if len(run) > 1:
            out.append((list(run), None))
        else:
            out.extend(([session], False) for session in run)
        run.clear()

    for members, side in sessions:
        joins = not side and all(h.speculative and not h.shadow for h in members)
        taken = {h.processor_id for session in run for h in session}
        behind_cheap = bool(run) and not _judged(run) and _judged([members])
        if joins and not taken & {h.processor_id for h in members} and not behind_cheap:
            run.append(members)
            continue
        close_run()
        if joins:
            run.append(members)
        else:
            out.append(([members], side))
    close_run()
    return out


def _judged(sessions: list[list[ProcessorHandle]]) -> bool:
    return any(h.judged for session in sessions for h in session)
