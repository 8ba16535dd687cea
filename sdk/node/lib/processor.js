'use strict';
// What a hook is handed: abort (TripWire), sendSignal, writer, reportViolation, the message
// list, the request context. The twin of the Python SDK's procmesh/_processor.py.

const { toValue } = require('./convert/values');
const { InvalidInputError } = require('./errors');

const SIGNAL_TYPES = new Set(['reactive', 'user', 'notification', 'state', 'system-reminder', 'user-message']);
const TAG_NAME = /^[A-Za-z_][A-Za-z0-9_.-]*$/;

/**
 * Thrown by `abort()`: ends the hook and tells the orchestrator to stop (or retry the step).
 * A hook may also throw one itself: `throw new TripWire(reason, { retry, metadata })`.
 */
class TripWire extends Error {
  constructor(reason, options = {}, processorId = undefined) {
    super(reason || '');
    this.name = 'TripWire';
    this.reason = reason || '';
    this.options = { retry: Boolean(options && options.retry), metadata: options ? options.metadata : undefined };
    this.retry = this.options.retry;
    this.metadata = this.options.metadata;
    this.processorId = processorId;
  }
}

/**
 * Optional base class. Any object with a string `id` and at least one hook method can be
 * served; extending this only documents the fields the server reads.
 */
class Processor {
  constructor() {
    if (this.id === undefined) this.id = '';
  }

  /** Prepare resources; health reports SERVING only after every setup() resolved. */
  async setup() {}

  /** Release resources when the server stops. */
  async teardown() {}
}

function plainObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** What a hook did besides its return value: abort, signals, custom chunks, violations. */
class HookEffects {
  constructor(processorId) {
    this.processorId = processorId;
    this.signals = [];
    this.customChunks = [];
    this.violations = [];
    this.abort = null;
    /** Request-context values the hook set (`requestContext.set`); null where it cannot set any. */
    this.contextUpdates = new Map();
    this.abortHook = (reason, options) => {
      throw new TripWire(reason || `Tripwire triggered by ${processorId}`, options || {}, processorId);
    };
    this.sendSignal = async (signal) => this.addSignal(signal);
    this.reportViolation = (message, detail) => {
      this.violations.push([String(message), detail]);
    };
  }

  addSignal(signal) {
    if (!plainObject(signal)) {
      throw new InvalidInputError("sendSignal expects an object like { type: 'reactive', contents: '...' }");
    }
    const kind = signal.type === undefined ? 'reactive' : signal.type;
    if (!SIGNAL_TYPES.has(kind)) throw new InvalidInputError(`sendSignal: unknown signal type ${JSON.stringify(kind)}`);
    if (typeof signal.contents !== 'string') throw new InvalidInputError("sendSignal: 'contents' must be a string");
    const tag = signal.tagName;
    if (tag !== undefined && tag !== null && tag !== '' && !(typeof tag === 'string' && TAG_NAME.test(tag))) {
      throw new InvalidInputError(`sendSignal: invalid tagName ${JSON.stringify(tag)}`);
    }
    for (const key of ['attributes', 'metadata']) {
      if (signal[key] !== undefined && signal[key] !== null && !plainObject(signal[key])) {
        throw new InvalidInputError(`sendSignal: '${key}' must be an object`);
      }
    }
    for (const attr of Object.keys(signal.attributes || {})) {
      if (!TAG_NAME.test(attr)) throw new InvalidInputError(`sendSignal: invalid attribute name ${JSON.stringify(attr)}`);
    }
    if (kind === 'state' && signal.transient) throw new InvalidInputError('sendSignal: state signals cannot be transient');
    this.signals.push({ ...signal });
  }
}

/** The hook's `writer`: `custom()` emits a data-* chunk to the client. */
class Writer {
  constructor(effects) {
    this._effects = effects;
  }

  /** Emit a custom chunk `{ type: 'data-...', data }`. */
  async custom(chunk) {
    const kind = plainObject(chunk) ? chunk.type : undefined;
    if (typeof kind !== 'string' || !kind.startsWith('data-')) {
      throw new InvalidInputError(`writer.custom: chunk type must start with 'data-', got ${JSON.stringify(kind ?? null)}`);
    }
    this._effects.customChunks.push(chunk);
  }
}

/**
 * The live message list a hook may edit in place; edits are sent back to the orchestrator.
 * `messages` arguments are snapshots, this is the list itself. Besides `getAll()`, the
 * reference engine's `get.all.db()` reads it too.
 */
class MessageList {
  /**
   * `sources`: where each message came from, by id (RunContext.message_sources); a message the
   * orchestrator sent without one is `input`. A message this hook adds is in `get.all` only: the
   * orchestrator files it (the next hook sees its source).
   */
  constructor(messages, sources = {}) {
    this._messages = [...messages];
    this.modified = false;
    this._sources = new Map(this._messages.map((m) => [String(m && m.id), (sources && sources[m && m.id]) || 'input']));
  }

  /** Every message, in order. */
  getAll() {
    return [...this._messages];
  }

  /**
   * The reference engine's read views: `get.all.db()`, and each source's messages:
   * `get.input.db()` (this call's input), `get.response.db()` (what this run added),
   * `get.remembered.db()` (loaded from memory).
   */
  get get() {
    const of = (source) => ({ db: () => this._messages.filter((m) => this._sources.get(String(m && m.id)) === source) });
    return { all: { db: () => this.getAll() }, input: of('input'), response: of('response'), remembered: of('memory') };
  }

  /** Append a message (replaces the message with the same id, if any). */
  add(message) {
    const list = Array.isArray(message) ? message : [message];
    for (const msg of list) {
      this.removeByIds([msg && msg.id]);
      this._messages.push(msg);
      this.modified = true;
    }
    return this;
  }

  /** Remove the messages with these ids. */
  removeByIds(ids) {
    const drop = new Set(ids);
    const kept = this._messages.filter((m) => !drop.has(m && m.id));
    if (kept.length !== this._messages.length) {
      this._messages = kept;
      this.modified = true;
    }
    return this;
  }

  /** Replace the message with the same id in place. */
  replace(message) {
    const i = this._messages.findIndex((m) => m && message && m.id === message.id);
    if (i < 0) throw new InvalidInputError(`messageList.replace: no message with id ${JSON.stringify(message && message.id)}`);
    this._messages[i] = message;
    this.modified = true;
    return this;
  }
}

/** The caller's request context: a Map (`get(key)` as in the reference engine) that serializes as an object. */
class RequestContext extends Map {
  /**
   * `updates` (a Map): where `set()` records the values a hook sets for the rest of the run
   * (HookEffects.request_context_updates); null: this hook cannot set any (processOutputStream);
   * absent: a plain Map.
   */
  constructor(entries, updates) {
    super(entries instanceof Map ? entries : Object.entries(entries || {}));
    Object.defineProperty(this, 'updates', { value: updates, enumerable: false });
  }

  /** The seeds' `requestContext.set(key, value)`: later hooks and the run's tools see the value. */
  set(key, value) {
    const updates = this.updates;
    if (updates === undefined) return super.set(key, value); // a plain Map (and while constructing)
    if (updates === null) {
      throw new TypeError('requestContext.set: processOutputStream cannot set request-context values (a unary hook can)');
    }
    if (typeof key !== 'string' || !key) throw new TypeError(`requestContext.set: the key must be a non-empty string, got ${String(key)}`);
    try {
      toValue(value);
    } catch (err) {
      throw new TypeError(`requestContext.set(${JSON.stringify(key)}): the value must be JSON: ${err.message}`);
    }
    updates.set(key, value);
    return super.set(key, value);
  }

  delete(key) {
    if (this.updates !== undefined) throw new TypeError('a hook cannot remove request-context keys (set a value instead)');
    return super.delete(key);
  }

  clear() {
    if (this.updates !== undefined) throw new TypeError('a hook cannot remove request-context keys (set a value instead)');
    super.clear();
  }

  toJSON() {
    return Object.fromEntries(this);
  }
}

module.exports = { HookEffects, MessageList, Processor, RequestContext, TripWire, Writer };
