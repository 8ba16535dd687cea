'use strict';
// Fused unary requests: several processors of this sidecar in one call (RunContext.fused), the
// twin of the Python SDK's procmesh/_fused.py. Each processor runs exactly as its own call would
// (own options, state, effects, span, metrics), one after another on the same request, while
// each leaves its input as it came: no result field, no signal, no abort, no failure. The answer
// carries the last one's result fields, the first one's effects, and effects.fused[i] for
// context.fused[i] (proto/README.md, "Fused processors").

const { status } = require('@grpc/grpc-js');

const { clip } = require('./guard');
const { ProcmeshError } = require('./errors');
const { outcomeOf } = require('./tracing');

const CODE_NAMES = Object.fromEntries(Object.entries(status).map(([name, code]) => [code, name]));

/** The hook left its input as it came: no result field, no signal, no abort. */
function passes(response) {
  const effects = response.effects || {};
  // a value set in the request context ends the chain too: the next processor would not see it
  return !(effects.signals && effects.signals.length) && !effects.request_context_updates && outcomeOf(response) === 'pass';
}

/** What a failed further processor's outcome says: "<status code name>: <message>". */
function errorText(err) {
  return `${CODE_NAMES[err.code] || 'UNKNOWN'}: ${clip(err.message)}`;
}

/**
 * Run `first`, then `chain` (the hosted processors of `members`, looked up before anything ran),
 * while each passes its input on. `one(hosted, member)` is one processor's call. The first
 * processor's failure fails the call; a later one's is its outcome's error and ends the chain.
 */
async function runFused(one, first, chain, members) {
  const response = await one(first);
  if (!passes(response)) return response;
  const fused = [];
  response.effects.fused = fused;
  for (let i = 0; i < chain.length; i++) {
    let answer;
    try {
      answer = await one(chain[i], members[i]);
    } catch (err) {
      if (!(err instanceof ProcmeshError)) throw err;
      fused.push({ error: errorText(err) });
      break;
    }
    fused.push({ effects: answer.effects });
    if (!passes(answer)) {
      // its result fields are the answer's (everything before it set none), with the effects so far
      answer.effects = response.effects;
      return answer;
    }
  }
  return response;
}

module.exports = { errorText, runFused };
