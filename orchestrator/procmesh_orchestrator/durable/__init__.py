"""Durable runs: checkpointed at every step boundary, leased to one replica, taken over when it dies.

A durable run's row in the store holds its snapshot and a lease (the replica that runs it, until
when); its chunks go to an event log with offsets before any client sees them. The replica
renews the lease while the run goes on and stops the run itself before a lease it could not
renew expires. Every replica claims runs whose lease expired (the database's locking decides
who), of the agents it has only, and continues each from its last snapshot: processInput does not
run again; the interrupted step's model call (and tools) may. Chunks the dead replica already
published are not published again (the log refuses an offset it holds), and memory is saved once,
at the run's end, as the run's turn (a repeated save replaces it).

A replica that was paused (SIGSTOP, a long GC, a VM migration) can wake after its lease expired
and another replica took the run over. Fencing makes that harmless: every claim raises the run's
epoch (its fencing token), the claimant raises the event log's fence to it before its claim
commits, and every write the run makes — checkpoint, renewal, finish, event, memory save,
suspension, cost reservation — names the epoch its replica holds and is refused, in the same
statement or script, once the epoch moved on. At the first refused write the stale replica stops
the run, logs a WARNING naming both epochs and counts it (``procmesh_durable_fenced_writes_total``).

All of it is this package: `runs` (`DurableRuns`), `publisher` (chunks into the log), `takeover`,
`config` (`DurableConfig`, the configuration's ``durable`` section) and `events` (the event log).
The service's view of durable runs (requests, callers, errors) is ``service/api/durable.py``'s.
"""

from procmesh_orchestrator.durable.runs import DurableRuns, config_version, replica_id

__all__ = ["DurableRuns", "config_version", "replica_id"]
