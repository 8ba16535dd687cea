'use strict';
// The `model` hook argument (the twin of the Python SDK's procmesh._model): the orchestrator's
// models through its model gateway, procmesh.v1.ModelService. `await args.model('openai/gpt-5-nano')
// .generate(messages, { schema })` calls the orchestrator, which holds the provider keys. The
// gateway is PROCMESH_MODEL_GATEWAY (the orchestrator's unix:///path.sock, no key needed, or its
// host:port with PROCMESH_MODEL_GATEWAY_KEY, a key with the gateway role, and
// PROCMESH_MODEL_GATEWAY_CA/_CERT/_CERT_KEY when that port serves TLS); each call carries the hook's remaining deadline (30 s without one),
// is cancelled with the hook (its abortSignal), and carries the hook span's trace context. Calls
// made at once (a Promise.all over a conversation's messages) leave in one GenerateBatch call
// (./model_batch), each with its own deadline, answer and error. A gateway error is a ModelError
// (an InternalError): the processor's failure policy applies.

const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const convert = require('./convert');
const { LOADER_OPTIONS, protoDir } = require('./contract');
const { InternalError } = require('./errors');
const { Batches } = require('./model_batch');
const tracing = require('./tracing');

const DEFAULT_TIMEOUT_MS = 30_000;
const batches = new Batches();

/** The gateway refused or failed a call; `status` is its gRPC status code. */
class ModelError extends InternalError {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

const deadlines = new WeakMap();
/** Record the deadline (epoch ms) of the hook call whose abort signal is `signal`. */
function noteDeadline(signal, deadline) {
  if (signal && Number.isFinite(deadline)) deadlines.set(signal, deadline);
}

// TLS to an orchestrator whose gRPC port serves it (PROCMESH_TLS_CERT there): the CA that
// verifies it, and the client pair when it requires one; the same settings as the Python SDK's.
function credentials(env) {
  const { PROCMESH_MODEL_GATEWAY_CA: ca, PROCMESH_MODEL_GATEWAY_CERT: cert, PROCMESH_MODEL_GATEWAY_CERT_KEY: key } = env;
  if (!ca) {
    if (cert || key) {
      throw new ModelError('PROCMESH_MODEL_GATEWAY_CERT/_CERT_KEY need PROCMESH_MODEL_GATEWAY_CA (the client certificate is for the orchestrator\'s TLS port)', grpc.status.FAILED_PRECONDITION);
    }
    return grpc.credentials.createInsecure();
  }
  if (!cert !== !key) {
    throw new ModelError('PROCMESH_MODEL_GATEWAY_CERT and PROCMESH_MODEL_GATEWAY_CERT_KEY go together', grpc.status.FAILED_PRECONDITION);
  }
  const read = (path) => (path ? fs.readFileSync(path) : null);
  try {
    return grpc.credentials.createSsl(read(ca), read(key), read(cert));
  } catch (err) {
    throw new ModelError(`model gateway TLS: ${err.message}`, grpc.status.FAILED_PRECONDITION);
  }
}

let client = null;
function gateway(env = process.env) {
  const address = (env.PROCMESH_MODEL_GATEWAY || '').trim();
  if (!address) {
    throw new ModelError('no model gateway: set PROCMESH_MODEL_GATEWAY to the orchestrator\'s gRPC address (host:port)', grpc.status.FAILED_PRECONDITION);
  }
  const tls = [env.PROCMESH_MODEL_GATEWAY_CA, env.PROCMESH_MODEL_GATEWAY_CERT, env.PROCMESH_MODEL_GATEWAY_CERT_KEY]
    .map((path) => path || '').join('\n');
  if (client === null || client.address !== address || client.tls !== tls) {
    const def = protoLoader.loadSync('procmesh/v1/model.proto', { ...LOADER_OPTIONS, includeDirs: [protoDir()] });
    const { ModelService } = grpc.loadPackageDefinition(def).procmesh.v1;
    client = { address, tls, stub: new ModelService(address, credentials(env)) };
  }
  return { stub: client.stub, key: env.PROCMESH_MODEL_GATEWAY_KEY || '' };
}

/** The active trace context, else `span`'s (an output-stream session's, not active around its
 * parts: ./stream), as the call's metadata. */
function traceMetadata(metadata, span) {
  let api;
  try {
    api = require('@opentelemetry/api');
  } catch {
    return; // tracing is optional
  }
  let context = api.context.active();
  if (!api.trace.getSpan(context) && span && span._span) context = api.trace.setSpan(context, span._span);
  const carrier = {};
  api.propagation.inject(context, carrier);
  for (const [key, value] of Object.entries(carrier)) metadata.set(key, String(value));
}

function textOf(message) {
  const content = message.content !== undefined ? message.content : message.text;
  if (typeof content === 'string') return content;
  const parts = Array.isArray(content) ? content : (content && content.parts) || [];
  return parts.filter((p) => p && (p.type || 'text') === 'text').map((p) => p.text || '').join('');
}

/** One of the orchestrator's models, as a hook calls it: `model(ref)`. */
class Model {
  constructor(ref, processorId, runId, signal, log = undefined, spanOf = null) {
    this.ref = ref;
    this._processorId = processorId;
    this._runId = runId;
    this._signal = signal;
    this._log = log;
    this._spanOf = spanOf;
  }

  /**
   * Ask the model. `messages`: one user message's text, or `{role, content}` messages. Options:
   * `schema` (a JSON schema: the result's `object` is the parsed answer), `temperature`,
   * `maxOutputTokens`, `timeoutMs` (capped by the hook's deadline), `section` (with `schema`:
   * `{content, instructions, question, phase}`, a typed verdict the gateway may judge in one call
   * with other guards' about the same content; the answer is this call's own section either way).
   * Resolves to `{text, object, usage, finishReason, model, attempts}`; rejects with a ModelError.
   */
  generate(messages, { schema, temperature, maxOutputTokens, timeoutMs, section } = {}) {
    const { stub, key } = gateway();
    const list = typeof messages === 'string' ? [{ role: 'user', content: messages }] : messages;
    const request = {
      model: this.ref,
      messages: list.map((m) => ({ role: m.role || 'user', text: textOf(m) })),
      processor_id: this._processorId,
      run_id: this._runId,
    };
    if (schema) request.schema = convert.toStruct(schema);
    if (temperature !== undefined) request.temperature = temperature;
    if (maxOutputTokens !== undefined) request.max_output_tokens = maxOutputTokens;
    if (section) {
      const { content = '', instructions = '', question = '', phase = 'input' } = section;
      request.section = { content, instructions, question, phase };
    }
    const hookDeadline = this._signal ? deadlines.get(this._signal) : undefined;
    const bounds = [timeoutMs === undefined ? undefined : Date.now() + timeoutMs, hookDeadline].filter((d) => d !== undefined);
    const deadline = bounds.length ? Math.min(...bounds) : Date.now() + DEFAULT_TIMEOUT_MS;
    const metadata = new grpc.Metadata();
    if (key) metadata.set('authorization', `Bearer ${key}`);
    traceMetadata(metadata, this._spanOf ? this._spanOf() : null);
    // calls made in the same turn of the event loop go in one GenerateBatch (./model_batch)
    return batches.generate(stub, request, deadline, metadata, this._signal, this._log).then(
      (resp) => {
        const usage = resp.usage || {};
        return {
          text: resp.text || '',
          object: resp.object ? convert.fromValue(resp.object) : undefined,
          usage: { inputTokens: usage.input_tokens || 0, outputTokens: usage.output_tokens || 0, totalTokens: usage.total_tokens || 0 },
          finishReason: resp.finish_reason || '',
          model: resp.model || '',
          attempts: resp.attempts || 1,
        };
      },
      (err) => {
        const name = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code) || String(err.code);
        throw new ModelError(`model gateway: '${this.ref}' failed with ${name}: ${err.details || ''}`, err.code);
      },
    );
  }

  /**
   * Tell the gateway this processor settled `count` questions for this model without asking it
   * (a cheap pre-check): the orchestrator counts them as judge calls saved, `by="precheck"`.
   * Returns at once and never throws: a report the gateway refuses (or no gateway configured) is
   * dropped, since a count must never fail or slow a hook. The hook's span counts them too
   * (`procmesh.judge.precheck_saved`, when tracing is on), as the Python SDK's does.
   */
  reportSaved(count = 1) {
    if (!(count >= 1)) return;
    tracing.addToCurrent('procmesh.judge.precheck_saved', Math.floor(count));
    let gw;
    try {
      gw = gateway();
    } catch {
      return; // no gateway: nothing asks the judge, nothing to count
    }
    const metadata = new grpc.Metadata();
    if (gw.key) metadata.set('authorization', `Bearer ${gw.key}`);
    const request = { processor_id: this._processorId, run_id: this._runId, count: Math.floor(count) };
    gw.stub.ReportSaved(request, metadata, { deadline: new Date(Date.now() + DEFAULT_TIMEOUT_MS) }, () => {});
  }
}

/** The `model` hook argument: `model(ref)` is the orchestrator's model `ref` (`log`: the sidecar's). */
function models(ctx, signal, log = undefined) {
  const processorId = (ctx && ctx.processor_id) || '';
  const runId = (ctx && ctx.run_id) || '';
  const model = (ref) => new Model(ref, processorId, runId, signal, log, () => model.span);
  /** The span its calls carry when none is active: an output-stream session's (./stream). */
  model.span = null;
  return model;
}

module.exports = { Model, ModelError, models, noteDeadline };
