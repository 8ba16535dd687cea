'use strict';
// What the server does with input it refuses, the twin of procmesh/_guard.py: requests arrive as
// Buffers and are decoded here, so one that does not decode is INVALID_ARGUMENT (grpc-js would
// answer INTERNAL "Error deserializing request"); refusals are logged as one WARNING per interval
// with a count, request content only at DEBUG; echoed ids and status details are bounded, so a
// huge field cannot turn the answer into RESOURCE_EXHAUSTED (details travel in 8 KiB of metadata).

const { InvalidInputError } = require('./errors');
const { keepUnknownParts, writeUnknownParts } = require('./unknown');

const ID_CHARS = 64;
const DETAIL_CHARS = 1024;
const WARN_INTERVAL_MS = 10000;

/** `'id'`, cut to `limit` characters (saying how long it was). */
function short(value, limit = ID_CHARS) {
  const text = String(value);
  return text.length <= limit ? `'${text}'` : `'${text.slice(0, limit)}'... (${text.length} characters)`;
}

/** A status detail of at most DETAIL_CHARS characters. */
function clip(detail) {
  const text = String(detail);
  return text.length <= DETAIL_CHARS ? text : `${text.slice(0, DETAIL_CHARS - 20)}... (${text.length} characters)`;
}

/** Refused requests: one WARNING per interval with the count left out; details at DEBUG. */
class RejectLog {
  constructor(log, intervalMs = WARN_INTERVAL_MS) {
    this.log = log;
    this.intervalMs = intervalMs;
    this.next = 0;
    this.leftOut = 0;
    this.total = 0;
  }

  /** Record one refused `hook` call; `why` must not contain request content (`detail` may). */
  note(hook, why, detail) {
    this.log.debug(`refused a ${hook} request: ${why}`, detail === undefined ? '' : String(detail));
    this.total += 1;
    const now = Date.now();
    if (now < this.next) {
      this.leftOut += 1;
      return;
    }
    const more = this.leftOut ? `; ${this.leftOut} more refused since the last warning` : '';
    this.leftOut = 0;
    this.next = now + this.intervalMs;
    this.log.warn(`refused a malformed ${hook} request: ${why}${more}`);
  }
}

/**
 * The service definition with every request left undecoded (a Buffer), and per method the
 * decoder to apply in the handler: `{ service, decoders }`.
 */
function rawService(service) {
  const raw = {};
  const decoders = {};
  for (const [name, method] of Object.entries(service)) {
    // A message part of a kind this SDK does not know passes through untouched (./unknown).
    raw[name] = { ...method, requestDeserialize: (buf) => buf, responseSerialize: writeUnknownParts(name, method.responseSerialize) };
    decoders[name] = keepUnknownParts(name, method.requestDeserialize);
  }
  return { service: raw, decoders };
}

/** `buf` decoded by `decoder`, or InvalidInputError (corrupt bytes, too deep for the decoder). */
function decode(decoder, buf, hook, rejects, typeName) {
  try {
    return decoder(buf);
  } catch (err) {
    rejects.note(hook, `not a valid ${typeName} (${buf.length} bytes)`, err && err.message);
    throw new InvalidInputError(`malformed ${hook} request: not a valid ${typeName} (corrupt bytes or nested too deeply)`);
  }
}

module.exports = { RejectLog, clip, decode, rawService, short };
