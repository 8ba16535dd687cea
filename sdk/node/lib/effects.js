'use strict';
// Encoding what a hook left behind: its messages, its effects (abort, signals, custom chunks,
// violations, state) and the gRPC status of what it threw. Shared by the unary handlers and the
// output stream, so both report a hook's faults the same way.

const grpc = require('@grpc/grpc-js');

const convert = require('./convert');
const { InternalError, ProcmeshError } = require('./errors');
const { clip } = require('./guard');
const { MessageList } = require('./processor');

/** A plain object a hook returned (a MessageList is the live list, not an object of overrides). */
function plainObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof MessageList);
}

function quote(text) {
  return `'${String(text)}'`;
}

/** A hook's messages (an array or the MessageList) as proto messages; anything else is INTERNAL. */
function fillMessages(messages, hook) {
  if (messages instanceof MessageList) messages = messages.getAll();
  if (!Array.isArray(messages)) throw new InternalError(`${hook} returned messages of type ${convert.describe(messages)}; expected an array`);
  return messages.map((msg) => {
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) {
      throw new InternalError(`${hook} returned a message of type ${convert.describe(msg)}; expected an object`);
    }
    try {
      return convert.messageToProto(msg);
    } catch (err) {
      throw new InternalError(`${hook} returned a malformed message: ${err.message}`);
    }
  });
}

/** The HookEffects (and the state, when given) as a proto Effects message. */
function fillEffects(effects, state) {
  // Everything here came from the hook (state included): a conversion failure is the
  // processor's fault (INTERNAL), not a malformed request (INVALID_ARGUMENT).
  try {
    const out = {
      signals: effects.signals.map(convert.signalToProto),
      custom_chunks: effects.customChunks.map(convert.chunkToProto),
      violations: effects.violations.map(([message, detail]) => {
        const v = { message };
        if (detail !== undefined && detail !== null) v.detail = convert.toValue(detail);
        return v;
      }),
    };
    if (effects.abort) {
      out.abort = convert.abortToProto({ reason: effects.abort.reason, retry: effects.abort.retry, metadata: effects.abort.metadata });
    }
    if (state !== undefined) out.state = convert.toStruct(state);
    if (effects.contextUpdates && effects.contextUpdates.size) {
      out.request_context_updates = convert.toStruct(Object.fromEntries(effects.contextUpdates));
    }
    return out;
  } catch (err) {
    throw new InternalError(`processor ${quote(effects.processorId)} left effects or state that cannot be sent: ${err.message}`);
  }
}

/** The gRPC status for what a call threw: a ProcmeshError keeps its code, anything else is INTERNAL. */
function toStatus(err) {
  // clipped: details travel in 8 KiB of metadata, and a huge echoed field would make it RESOURCE_EXHAUSTED
  if (err instanceof ProcmeshError) return { code: err.code, details: clip(err.message) };
  return { code: grpc.status.INTERNAL, details: clip(`unexpected error: ${err && err.stack ? err.stack : String(err)}`) };
}

module.exports = { fillEffects, fillMessages, plainObject, quote, toStatus };
