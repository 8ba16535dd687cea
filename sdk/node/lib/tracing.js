'use strict';
// OpenTelemetry tracing for a Node sidecar: optional, and off unless the standard variables ask
// (the twin of the Python SDK's procmesh/tracing.py, with the same switches, span names and
// attributes).
//
// The OpenTelemetry packages are optionalDependencies: without them, or without
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), every function here is a
// no-op that costs one check. With them, spans are exported over OTLP/HTTP (protobuf) with the
// exporter's own variables (headers, timeout, ...), the service named by OTEL_SERVICE_NAME or
// the default. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off.
//
// The W3C trace context travels in gRPC metadata (traceparent, tracestate): the orchestrator
// injects it into every hook call and stream; a sidecar continues it in a SERVER span around each
// hook. No user content goes into span attributes: ids, names, outcomes.

const KINDS = ['internal', 'server', 'client'];

/** The loaded OpenTelemetry modules and our provider/tracer, while tracing is on. */
let otel = null;

function wanted(env) {
  if ((env.OTEL_SDK_DISABLED || '').trim().toLowerCase() === 'true') return false;
  if ((env.OTEL_TRACES_EXPORTER || 'otlp').toLowerCase().split(',').map((s) => s.trim()).includes('none')) return false;
  return Boolean(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT);
}

/** The OpenTelemetry packages, or null when the optional dependencies are not installed. */
function load() {
  try {
    return {
      api: require('@opentelemetry/api'),
      core: require('@opentelemetry/core'),
      node: require('@opentelemetry/sdk-trace-node'),
      exporter: require('@opentelemetry/exporter-trace-otlp-proto'),
      resources: require('@opentelemetry/resources'),
      semconv: require('@opentelemetry/semantic-conventions'),
    };
  } catch (err) {
    if (err && err.code === 'MODULE_NOT_FOUND') return null;
    throw err;
  }
}

/**
 * Start exporting spans when the environment asks for it (idempotent); whether tracing is on.
 * `serviceName` is the default service.name (OTEL_SERVICE_NAME wins); `log.warn` hears why
 * tracing stays off when the environment asked for it.
 */
function setup(serviceName, log = { warn: (...a) => console.error(...a) }, env = process.env) {
  if (otel !== null) return true;
  if (!wanted(env)) return false;
  const protocol = env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL || 'http/protobuf';
  if (protocol !== 'http/protobuf') {
    log.warn(`tracing is off: OTLP protocol '${protocol}' is not supported (use http/protobuf)`);
    return false;
  }
  const m = load();
  if (m === null) {
    log.warn('tracing is off: OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed (install @procmesh/sdk with its optional dependencies)');
    return false;
  }
  const { resources, semconv } = m;
  const name = env.OTEL_SERVICE_NAME || serviceName;
  // The defaults (telemetry.sdk.*), then OTEL_RESOURCE_ATTRIBUTES, then the service name.
  const resource = resources
    .detectResources({ detectors: [resources.envDetector] })
    .merge(resources.resourceFromAttributes({ [semconv.ATTR_SERVICE_NAME]: name }));
  const provider = new m.node.NodeTracerProvider({
    resource,
    spanProcessors: [new m.node.BatchSpanProcessor(new m.exporter.OTLPTraceExporter())],
  });
  // Global provider, AsyncLocalStorage context and W3C propagators: spans a hook starts itself
  // (or its instrumented libraries) are children of the hook's span.
  provider.register();
  otel = { ...m, provider, tracer: provider.getTracer('procmesh'), propagator: new m.core.W3CTraceContextPropagator() };
  return true;
}

/** Whether spans are being recorded. */
function enabled() {
  return otel !== null;
}

/** Export what is buffered (a server stopping); tracing stays on. Never rejects: spans are best effort. */
async function flush() {
  if (otel !== null) await otel.provider.forceFlush().catch(() => {});
}

/** Export what is buffered and stop (at process exit). */
async function shutdown() {
  const current = otel;
  otel = null;
  if (current !== null) await current.provider.shutdown();
}

/** A recording span's handle (attributes, the outcome); a no-op when tracing is off. */
class Span {
  constructor(span = null) {
    this._span = span;
    this._ended = false;
  }

  /** Set an attribute (string, boolean, number, or an array of them); null/undefined are skipped. */
  set(key, value) {
    if (this._span !== null && value !== undefined && value !== null) this._span.setAttribute(key, value);
  }

  /** The procmesh.outcome attribute (pass, rewrite, abort, retry, failure, ok, error). */
  outcome(value) {
    this.set('procmesh.outcome', value);
  }

  /** The span's trace id in hex, '' when off. */
  traceId() {
    return this._span === null ? '' : this._span.spanContext().traceId;
  }

  /** End the span (once), marked as an error of `error`'s type when given (never its message). */
  end(error) {
    if (this._span === null || this._ended) return;
    this._ended = true;
    if (error !== undefined && error !== null) {
      this._span.setStatus({ code: otel ? otel.api.SpanStatusCode.ERROR : 2, message: errorType(error) });
    }
    this._span.end();
  }
}

function errorType(error) {
  return (error && error.constructor && error.constructor.name) || (error && error.name) || typeof error;
}

function attributesOf(attributes) {
  return Object.fromEntries(Object.entries(attributes || {}).filter(([, v]) => v !== undefined && v !== null));
}

/** The trace context in `metadata` (a grpc-js Metadata: traceparent, tracestate), a Context. */
function extract(metadata) {
  const carrier = {};
  for (const key of ['traceparent', 'tracestate']) {
    const values = metadata && typeof metadata.get === 'function' ? metadata.get(key) : [];
    if (values.length) carrier[key] = Buffer.isBuffer(values[0]) ? values[0].toString('latin1') : String(values[0]);
  }
  return otel.propagator.extract(otel.api.ROOT_CONTEXT, carrier, otel.api.defaultTextMapGetter);
}

function startRaw(name, kind, attributes, parent) {
  if (!KINDS.includes(kind)) throw new TypeError(`span kind ${kind} is not one of ${KINDS.join(', ')}`);
  const { api } = otel;
  const context = parent !== undefined && parent !== null ? extract(parent) : api.context.active();
  const spanKind = api.SpanKind[kind.toUpperCase()];
  return { span: otel.tracer.startSpan(name, { kind: spanKind, attributes: attributesOf(attributes) }, context), context };
}

/**
 * A span that is not made current, child of the current one (or of `parent`'s trace context, a
 * grpc-js Metadata); end it with Span.end. For work spanning many callbacks (a stream session).
 */
function start(name, { kind = 'internal', attributes, parent } = {}) {
  if (otel === null) return new Span();
  return new Span(startRaw(name, kind, attributes, parent).span);
}

/**
 * Run `fn(span)` inside a span, current while it runs; `parent` (a grpc-js Metadata) continues the
 * caller's trace. A rejection or throw marks the span as an error (its type only: messages may
 * quote user content) and passes through.
 */
async function span(name, { kind = 'internal', attributes, parent } = {}, fn) {
  if (otel === null) return fn(new Span());
  const { api } = otel;
  const raw = startRaw(name, kind, attributes, parent);
  const handle = new Span(raw.span);
  try {
    return await api.context.with(api.trace.setSpan(raw.context, raw.span), () => fn(handle));
  } catch (err) {
    handle.end(err);
    throw err;
  } finally {
    handle.end();
  }
}

/**
 * The hook name on the wire, as the Python SDK's hook table spells it (procmesh.hook):
 * processLLMRequest -> process_llm_request, executeTool -> execute_tool.
 */
function wireHook(name) {
  return name
    .replace(/([a-z0-9])([A-Z])/g, '$1_$2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1_$2')
    .toLowerCase();
}

/**
 * The sidecar's span of one call, child of the caller's (the trace context in `metadata`), around
 * `fn(span)`: `procmesh.hook <hook> <processorId or tool>`.
 */
function hookSpan(hook, processorId, metadata, fn, { tool = '' } = {}) {
  if (otel === null) return fn(new Span());
  const wire = wireHook(hook);
  const attributes = { 'procmesh.hook': wire, 'procmesh.processor.id': processorId || undefined };
  if (tool) attributes['gen_ai.tool.name'] = tool;
  return span(`procmesh.hook ${wire} ${processorId || tool}`, { kind: 'server', attributes, parent: metadata }, fn);
}

/** What `addToCurrent` added to each span, so a second report adds to the first. */
const added = new WeakMap();

/**
 * Add `count` to the numeric attribute `key` of the current span (the hook's, while a unary hook
 * runs); a no-op when tracing is off or no span is current (the Python SDK's span.add on the
 * hook's span).
 */
function addToCurrent(key, count) {
  if (otel === null) return;
  const current = otel.api.trace.getActiveSpan();
  if (current === undefined || !current.isRecording()) return;
  const sums = added.get(current) || {};
  sums[key] = (sums[key] || 0) + count;
  added.set(current, sums);
  current.setAttribute(key, sums[key]);
}

function isSet(value) {
  if (value === undefined || value === null || value === false || value === 0 || value === '') return false;
  return !(Array.isArray(value) && value.length === 0);
}

/**
 * What a unary hook's answer did: abort, retry (an abort that replays), rewrite (any field besides
 * the effects is set), or pass; the Python SDK's outcome_of.
 */
function outcomeOf(response) {
  const abort = response && response.effects && response.effects.abort;
  if (abort) return abort.retry ? 'retry' : 'abort';
  return Object.entries(response || {}).some(([k, v]) => k !== 'effects' && isSet(v)) ? 'rewrite' : 'pass';
}

module.exports = { Span, addToCurrent, enabled, flush, hookSpan, outcomeOf, setup, shutdown, span, start, wireHook };
