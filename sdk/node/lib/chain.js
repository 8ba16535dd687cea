'use strict';
// A fused ProcessOutputStream: each part through every processor of the stream, in order; the
// twin of the Python SDK's procmesh/_chain.py. The pipeline's per-processor rules hold
// (proto/README.md, "Fused processors"): data-* chunks only reach a processor with
// processDataParts; what a processor emits goes on to the later ones in the orchestrator's order
// (the data-signal chunks announcing its signals when announce_signals is set, then its custom
// chunks, then what it returned); an abort stops that processor (the chunks before it still go
// through the later ones, and a later processor's abort on them is the one that counts); a
// further processor that fails passes every later part through unchanged, its error set once.
// A batch goes through one processor at a time: each still sees its parts in stream order.
// `Results` and `pristine` are how a stream, fused or not, answers a run of parts its processors
// gave back unchanged with one result (unchanged_through) when the orchestrator takes it.

const { randomUUID } = require('node:crypto');
const { isDeepStrictEqual } = require('node:util');

const convert = require('./convert');
const { fillEffects, plainObject } = require('./effects');
const { InternalError, ProcmeshError } = require('./errors');
const { errorText } = require('./fused');
const { HookEffects } = require('./processor');

const DEFAULT_TAGS = {
  reactive: 'system-reminder',
  'system-reminder': 'system-reminder',
  'user-message': 'user',
  user: 'user',
  notification: 'notification',
  state: 'state',
};
const CANONICAL_TYPES = { 'system-reminder': 'reactive', 'user-message': 'user' };

/**
 * The transient data-signal chunk the orchestrator announces a signal with (its exact shape). The
 * signal gets its message id here when it has none, so the chunk and the signal message agree.
 */
function announced(signal) {
  if (!signal.id) signal.id = randomUUID();
  const kind = signal.type === undefined ? 'reactive' : signal.type;
  const data = {
    id: signal.id,
    type: CANONICAL_TYPES[kind] || kind,
    tagName: signal.tagName || DEFAULT_TAGS[kind] || kind,
    createdAt: new Date().toISOString(),
  };
  if (signal.attributes && Object.keys(signal.attributes).length) data.attributes = { ...signal.attributes };
  if (signal.transient) data.transient = true;
  data.contents = signal.contents ?? '';
  return { type: 'data-signal', data, transient: true };
}

/** A stream hook's return value as chunks: a chunk, an array of them, or nothing (dropped). */
function returnedChunks(result, hook) {
  if (result === undefined || result === null) return [];
  const chunks = Array.isArray(result) ? result : [result];
  for (const chunk of chunks) {
    if (!plainObject(chunk) || typeof chunk.type !== 'string') {
      throw new InternalError(`${hook} returned ${convert.describe(chunk)}; expected a chunk object, an array of them, or nothing`);
    }
  }
  return chunks;
}

/**
 * A copy of `chunk`, just converted from `part`, to tell afterwards whether the hooks gave it back
 * unchanged (equal to it, so encoding it again gives `part`), or null: only a text delta's (two
 * small objects), whose conversion back is exactly `part` when it is not marked transient.
 */
function pristine(chunk, part) {
  const kind = part.payload || (part.text_delta ? 'text_delta' : '');
  if (part.transient || kind !== 'text_delta') return null;
  return { type: chunk.type, payload: { ...chunk.payload } };
}

/** Whether what the hooks left (`out`) is the part as it came (`before`, from `pristine`). */
function untouched(out, before) {
  return before !== null && isDeepStrictEqual(out, before);
}

/**
 * A batch's results, in order. On a stream that takes them (unchanged_results), the parts passed
 * on unchanged in a row are one result (unchanged_through); otherwise each is a result holding
 * its part.
 */
class Results {
  constructor(unchanged) {
    this.unchanged = unchanged;
    this.items = [];
    /** The last result, while it is a run of unchanged parts the next one may extend. */
    this.run = null;
  }

  push(result) {
    this.items.push(result);
    this.run = null;
  }

  /** Part `seq` (`part`) goes on as it came, with no effects. */
  passed(seq, part) {
    if (!this.unchanged) this.push({ seq, part });
    else if (this.run !== null && this.run.unchanged_through + 1 === seq) this.run.unchanged_through = seq;
    else {
      this.run = { seq, unchanged_through: seq };
      this.items.push(this.run);
    }
  }

  /** The results so far (to send); the next ones start afresh. */
  take() {
    const items = this.items;
    this.items = [];
    this.run = null;
    return items;
  }
}

/**
 * The batch's results (up to the part whose abort ends the stream) and whether one aborted.
 * `call(stage, chunk, effects, quiet)` runs one chunk through one processor's hook.
 */
async function throughAll(stages, items, call, { hook, announce, quiet, unchanged }) {
  let parts = items.map((item) => {
    const chunk = convert.chunkFromProto(item.part);
    const before = unchanged ? pristine(chunk, item.part) : null;
    return { seq: item.seq || 0, part: item.part, flow: [chunk], before, did: [], errors: [] };
  });
  const aborts = new Map(); // stage index -> the part it aborted on
  for (let index = 0; index < stages.length; index++) {
    const stage = stages[index];
    for (let at = 0; at < parts.length; at++) {
      const part = parts[at];
      const did = new HookEffects(stage.hosted.id);
      part.did.push(did);
      part.errors.push('');
      const out = [];
      for (let position = 0; position < part.flow.length; position++) {
        const chunk = part.flow[position];
        if (!stage.takes(chunk.type)) {
          out.push(chunk);
          continue;
        }
        const effects = new HookEffects(stage.hosted.id);
        let chunks;
        try {
          chunks = returnedChunks(await call(stage, chunk, effects, quiet), hook);
        } catch (err) {
          if (index === 0 || !(err instanceof ProcmeshError)) throw err; // the first one's failure fails the stream
          stage.error = part.errors[index] = errorText(err);
          out.push(...part.flow.slice(position)); // failed open: from here on, unchanged
          break;
        }
        did.signals.push(...effects.signals);
        did.customChunks.push(...effects.customChunks);
        did.violations.push(...effects.violations);
        if (announce) out.push(...effects.signals.map(announced));
        out.push(...effects.customChunks);
        if (effects.abort) {
          did.abort = effects.abort;
          break;
        }
        out.push(...chunks);
      }
      part.flow = out;
      if (did.abort) {
        aborts.set(index, at);
        break;
      }
    }
    if (aborts.size) parts = parts.slice(0, Math.min(...aborts.values()) + 1); // the parts after an abort are never answered
  }
  if (aborts.size) {
    // The abort that ends the stream is the last processor's that aborted on the last part kept:
    // an earlier processor's abort on that part came behind chunks a later one aborted on.
    const last = parts.length - 1;
    const final = Math.max(...[...aborts].filter(([, at]) => at === last).map(([i]) => i));
    for (const [i, at] of aborts) if (i !== final && at === last) parts[last].did[i].abort = null;
  }
  const results = new Results(unchanged);
  for (const part of parts) {
    const quietAll = !part.errors.some(Boolean) && part.did.every((d) => !d.abort && !d.signals.length && !d.customChunks.length && !d.violations.length);
    if (quietAll && part.flow.length === 1 && untouched(part.flow[0], part.before)) results.passed(part.seq, part.part);
    else results.push(result(part, stages));
  }
  return [results.take(), aborts.size > 0];
}

function result(part, stages) {
  const res = { seq: part.seq };
  part.flow.forEach((chunk, i) => {
    let encoded;
    try {
      encoded = convert.chunkToProto(chunk);
    } catch (err) {
      throw new InternalError(`a processor of the fused stream ${JSON.stringify(stages.map((s) => s.hosted.id))} left a malformed chunk: ${err.message}`);
    }
    if (i === 0) res.part = encoded;
    else (res.extra_parts = res.extra_parts || []).push(encoded);
  });
  res.effects = fillEffects(part.did[0], undefined);
  res.effects.fused = part.did.slice(1).map((did, i) => ({ effects: fillEffects(did, undefined), error: part.errors[i + 1] }));
  return res;
}

module.exports = { Results, announced, pristine, throughAll, untouched };
