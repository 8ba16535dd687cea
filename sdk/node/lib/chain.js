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

const { randomUUID } = require('node:crypto');

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
 * The batch's results (up to the part whose abort ends the stream) and whether one aborted.
 * `call(stage, chunk, effects, quiet)` runs one chunk through one processor's hook.
 */
async function throughAll(stages, items, call, { hook, announce, quiet }) {
  let parts = items.map((item) => ({ seq: item.seq || 0, flow: [convert.chunkFromProto(item.part)], did: [], errors: [] }));
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
  return [parts.map((part) => result(part, stages)), aborts.size > 0];
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

module.exports = { announced, throughAll };
