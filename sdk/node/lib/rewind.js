'use strict';
// What a speculative processor's stream keeps to undo parts the orchestrator may still withdraw,
// the twin of the Python SDK's procmesh/_rewind.py. One record per batch (stream message): every
// processor's state, number of parts seen and failure before the batch, and the batch's parts. A
// rewind to seq r puts back the record of the first batch that reaches r and replays that
// batch's parts before r without answering them: exact because a speculative processor's
// results depend only on its input and state. One state copy per batch is the whole cost while
// nothing is withdrawn; committed_through lets records go.

const { InvalidInputError } = require('./errors');

const seqOf = (part) => Number(part.seq || 0);

class History {
  /** `stages`: objects with `args` (args.state is the state), `streamParts` and `error`. */
  constructor(stages) {
    this.stages = stages;
    this.records = [];
    this.committed = 0;
  }

  /** Record the stages as they are before `parts` (the next batch) go through them. */
  keep(parts) {
    if (!parts.length) return;
    this.records.push({
      states: this.stages.map((s) => structuredClone(s.args.state)),
      seen: this.stages.map((s) => s.streamParts.length),
      errors: this.stages.map((s) => s.error),
      parts: [...parts],
    });
  }

  /** Forget the batches no rewind can reach any more (every part's seq <= `through`). */
  commit(through) {
    this.committed = Math.max(this.committed, through);
    while (this.records.length && seqOf(this.records[0].parts.at(-1)) <= through) this.records.shift();
  }

  /** Withdraw the parts from seq `to` on: put the stages back and `replay(parts)` those before it. */
  async rewind(to, replay) {
    if (to <= this.committed) {
      throw new InvalidInputError(`rewind_to ${to} is at or below committed_through ${this.committed}: those parts are final`);
    }
    const at = this.records.findIndex((r) => seqOf(r.parts.at(-1)) >= to);
    if (at < 0) return; // no part from `to` on was received: nothing to withdraw
    const record = this.records[at];
    this.records.length = at;
    this.stages.forEach((stage, i) => {
      stage.args.state = structuredClone(record.states[i]); // the record stays as it was, for a later rewind
      stage.streamParts.length = record.seen[i];
      stage.error = record.errors[i];
    });
    const kept = record.parts.filter((p) => seqOf(p) < to);
    if (kept.length) {
      // they stay undoable, from the same "before" as the batch they came in
      this.records.push({ ...record, parts: kept });
      await replay(kept);
    }
  }
}

module.exports = { History };
