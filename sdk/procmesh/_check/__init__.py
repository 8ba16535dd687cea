"""`procmesh-check-sidecar ADDRESS`: check that a sidecar, in any language, keeps the procmesh.v1 contract.

The checker is a gRPC client only: it talks to the sidecar the way the orchestrator does
(proto/README.md) and prints one line per check, ``PASS``/``FAIL``/``SKIP``, then a summary.
The exit code is 0 when no check failed. It checks:

- health: ``grpc.health.v1`` reports SERVING for ``""`` and ``procmesh.v1.ProcessorService``;
- Describe: processor ids (non-empty, unique, no ``/``), hooks (known, no duplicates), options
  schemas (empty or a JSON object);
- malformed requests, per declared hook: an empty ``processor_id`` (INVALID_ARGUMENT), an unknown
  processor (NOT_FOUND), bytes that are no protobuf message (INVALID_ARGUMENT or INTERNAL, what stock
  generated servers answer); a message part of a kind the contract does not have yet (a newer
  orchestrator's) answers OK and comes back untouched in any message the hook returns; the sidecar
  must still be SERVING and answering afterwards;
- per processor: each declared hook answers valid requests OK with well-formed effects (a plain
  request and a probe meant to provoke aborts); undeclared hooks answer UNIMPLEMENTED;
  ProcessOutputStream answers several batches in order, one result per part with its seq, a
  ``data-*`` part passed through untouched unless the processor asks for data parts, and ends with
  ``StreamEnd`` after the half-close; state round-trips (a returned state keeps the keys it was
  sent and is built on by the next call); a call with a tiny deadline ends quickly
  (DEADLINE_EXCEEDED or OK) and leaves the sidecar healthy; every abort seen is well encoded.

The modules, by role: `requests` (the hooks as derived from `procmesh.hooks`, a valid request per
hook), `wire` (bounded calls and stream exchanges), `problems` (what makes an answer malformed),
`processor` (the per-processor checks), `checker` (the sidecar-wide checks and the run), `report`,
`cli` (the flags, ``--options [ID=]JSON`` among them: options per processor).
The public entry is `procmesh.check.check_sidecar`.

No check waits for longer than ``--timeout`` seconds (plus a little slack), so a broken sidecar
cannot hang the checker.
"""
