'use strict';
// Model gateway calls a hook makes at once, sent as one ModelService.GenerateBatch call (the twin
// of the Python SDK's procmesh._model_batch). An input guard judges every message of a
// conversation concurrently (`Promise.all(messages.map((m) => model(ref).generate(...)))`): ten
// turns in, that is 19 questions a guard, most answered by the gateway's verdict cache, and the
// gRPC work per call cost more than the lookups. So calls are gathered for one turn of the event
// loop and sent together: answers come back streamed as each is ready, matched by `index`, and
// each caller gets exactly what Generate would have given it (its answer, or its own status).
//
// The flush is scheduled with setImmediate, not queueMicrotask: a microtask flush runs as soon as
// the microtasks queued before it have run, so it gathers only the callers that reach `generate`
// in the same number of `await` hops (a Promise.all whose callbacks await a helper first would be
// cut in two), while setImmediate runs after the whole microtask queue has drained, gathering
// every call a Promise.all's callbacks make before any of them waits on I/O; the price is one
// loop turn (microseconds), like the Python SDK's `loop.call_soon`.
//
// Calls go together only to the same gateway client with the same metadata (the API key and the
// hook span's trace context). One call alone goes as Generate. Each item carries its own deadline
// (`timeout_seconds`); the batch call's deadline is the longest. A caller whose hook is cancelled
// is answered CANCELLED at once, as its Generate would be, and the others go on; the stream is
// cancelled once every caller is answered. A gateway answering UNIMPLEMENTED (an orchestrator
// older than GenerateBatch, met during a rolling upgrade) gets the calls again one by one, and
// single calls from then on (logged once).

const grpc = require('@grpc/grpc-js');

/** The gateway's limit on one batch's calls; more waiting go in further batches. */
const MAX_BATCH = 1024;

/** A call's failure as the gateway gave it: its gRPC status code and details. */
class GatewayStatus extends Error {
  constructor(code, details) {
    super(details);
    this.code = code;
    this.details = details;
  }
}

/** One caller's call: its request, deadline (epoch ms) and the promise it waits on. */
class Call {
  constructor(request, deadline, signal) {
    this.request = request;
    this.deadline = deadline;
    this.done = false;
    this.cancelSend = () => {}; // set by whatever sends the call: what a caller gone stops
    this.answer = new Promise((resolve, reject) => {
      this._resolve = resolve;
      this._reject = reject;
    });
    this._signal = signal;
    this._gone = () => {
      // the grpc-js status of a Generate cancelled by its hook
      if (this.settle(new GatewayStatus(grpc.status.CANCELLED, 'Cancelled on client'))) this.cancelSend();
    };
    if (signal) signal.addEventListener('abort', this._gone, { once: true });
  }

  /** Answer the caller (an error or a response), once; false when it was answered already. */
  settle(error, response) {
    if (this.done) return false;
    this.done = true;
    if (this._signal) this._signal.removeEventListener('abort', this._gone);
    if (error) this._reject(error);
    else this._resolve(response);
    return true;
  }
}

function metadataKey(metadata) {
  const map = metadata.getMap();
  return JSON.stringify(Object.keys(map).sort().map((k) => [k, String(map[k])]));
}

/** `call` as a Generate call of its own. */
function alone(stub, call, metadata) {
  if (call.done) return;
  const unary = stub.Generate(call.request, metadata.clone(), { deadline: new Date(call.deadline) }, (err, resp) => {
    if (err) call.settle(new GatewayStatus(err.code, err.details || ''));
    else call.settle(null, resp);
  });
  call.cancelSend = () => unary.cancel();
}

/** The calls waiting for the loop's next turn, by gateway client and metadata. */
class Batches {
  constructor() {
    this._waiting = new Map(); // stub -> Map(metadata key -> {metadata, calls, log})
    this._single = new WeakSet(); // stubs whose gateway has no GenerateBatch
  }

  /**
   * `request`'s answer through `stub` (a ModelService client), by `deadline` (epoch ms), cancelled
   * with `signal`: resolves to the ModelServiceGenerateResponse, rejects with a GatewayStatus.
   * `log` hears (once a gateway) that a gateway has no GenerateBatch.
   */
  generate(stub, request, deadline, metadata, signal, log) {
    const call = new Call(request, deadline, signal);
    let byMetadata = this._waiting.get(stub);
    if (!byMetadata) this._waiting.set(stub, (byMetadata = new Map()));
    const key = metadataKey(metadata);
    let group = byMetadata.get(key);
    if (!group) {
      group = { metadata, calls: [], log };
      byMetadata.set(key, group);
      setImmediate(() => this._flush(stub, key)); // why not queueMicrotask: the header
    }
    group.calls.push(call);
    return call.answer;
  }

  _flush(stub, key) {
    const byMetadata = this._waiting.get(stub);
    const group = byMetadata.get(key);
    byMetadata.delete(key);
    if (!byMetadata.size) this._waiting.delete(stub);
    const calls = group.calls.filter((c) => !c.done); // a caller gone meanwhile
    for (let start = 0; start < calls.length; start += MAX_BATCH) {
      const chunk = calls.slice(start, start + MAX_BATCH);
      if (chunk.length === 1 || this._single.has(stub)) chunk.forEach((c) => alone(stub, c, group.metadata));
      else this._together(stub, chunk, group.metadata, group.log);
    }
  }

  _together(stub, calls, metadata, log) {
    const now = Date.now();
    const items = calls.map((c) => ({ request: c.request, timeout_seconds: Math.max(c.deadline - now, 1) / 1000 }));
    const deadline = new Date(Math.max(...calls.map((c) => c.deadline)));
    const stream = stub.GenerateBatch({ items }, metadata.clone(), { deadline });
    const failRest = (error) => calls.forEach((c) => c.settle(error));
    const gone = () => {
      if (calls.every((c) => c.done)) stream.cancel(); // none is waiting for the rest any more
    };
    for (const c of calls) c.cancelSend = gone;
    stream.on('data', (answer) => {
      const index = answer.index || 0; // the loader leaves a field at its default unset
      if (!Number.isInteger(index) || index < 0 || index >= calls.length) {
        failRest(new GatewayStatus(grpc.status.INTERNAL, `the gateway answered an item it was not sent: ${index}`));
        stream.cancel();
        return;
      }
      if (answer.code) calls[index].settle(new GatewayStatus(answer.code, answer.message || ''));
      else calls[index].settle(null, answer.response || {});
    });
    // the end, once: the call's status, and (for OK) the stream's end, after its last answer
    // ('error' repeats a failed status; the stream's end may come before or after it)
    let status = null;
    let ended = false;
    let finished = false;
    const finish = () => {
      if (finished || !status || (status.code === grpc.status.OK && !ended)) return;
      finished = true;
      if (status.code === grpc.status.OK) {
        failRest(new GatewayStatus(grpc.status.INTERNAL, 'the gateway ended the batch without answering this call'));
      } else if (status.code === grpc.status.UNIMPLEMENTED) {
        if (!this._single.has(stub)) {
          this._single.add(stub);
          if (log) log.info('model gateway: no GenerateBatch (an older orchestrator): calls go one by one');
        }
        calls.forEach((c) => alone(stub, c, metadata));
      } else {
        failRest(new GatewayStatus(status.code, status.details || ''));
      }
    };
    stream.on('status', (received) => {
      status = received;
      finish();
    });
    stream.on('end', () => {
      ended = true;
      finish();
    });
    stream.on('error', () => {});
  }
}

module.exports = { Batches, GatewayStatus, MAX_BATCH };
