'use strict';
// The metrics the SDK records for every processor (authors add none), with the Python SDK's names
// and labels (procmesh/_metrics.py), so one dashboard reads sidecars in either language:
//   procmesh_sidecar_hook_calls_total{processor,hook,outcome}   outcome: ok, abort, cancelled, or
//                                                               the status code (internal, ...);
//                                                               a process_output_stream session
//                                                               counts once, at its end
//   procmesh_sidecar_stream_parts_total{processor,outcome}      each part of an output stream
//   procmesh_sidecar_hook_duration_seconds{processor,hook}      per part for process_output_stream
//   procmesh_sidecar_tool_calls_total{tool,outcome}             hosted tools; outcome: ok, tool_error, ...
//   procmesh_sidecar_tool_duration_seconds{tool}
//   procmesh_sidecar_build_info{sdk,version,runtime,grpc}       1
// plus prom-client's process_* (and nodejs_*) series. Hook label values are the proto enum's
// snake_case names (process_input), as in Python, not the camelCase method names.

const http = require('http');
const client = require('prom-client');
const { status } = require('@grpc/grpc-js');

const { HOOKS } = require('./hooks');
const { version } = require('../package.json');
const grpcVersion = require('@grpc/grpc-js/package.json').version;

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const SNAKE = new Map(HOOKS.map((h) => [h.name, h.enumName.replace(/^HOOK_/, '').toLowerCase()]));
const STREAM_HOOK = 'process_output_stream';
const CODE_NAMES = new Map(Object.entries(status).map(([name, code]) => [code, name.toLowerCase()]));

class SidecarMetrics {
  /** The SDK's series on `registry` (a private one by default, as in Python). */
  constructor(registry = new client.Registry()) {
    this.registry = registry;
    this.hookCalls = new client.Counter({
      name: 'procmesh_sidecar_hook_calls_total',
      help: 'Hook calls served, by processor, hook and outcome (ok, abort, cancelled, error code); a process_output_stream session counts once, at its end.',
      labelNames: ['processor', 'hook', 'outcome'],
      registers: [registry],
    });
    this.streamParts = new client.Counter({
      name: 'procmesh_sidecar_stream_parts_total',
      help: "Output-stream parts given to a processor's hook, by outcome (ok, abort, error code).",
      labelNames: ['processor', 'outcome'],
      registers: [registry],
    });
    this.hookLatency = new client.Histogram({
      name: 'procmesh_sidecar_hook_duration_seconds',
      help: 'Time spent in a processor hook (per part for process_output_stream).',
      labelNames: ['processor', 'hook'],
      buckets: LATENCY_BUCKETS,
      registers: [registry],
    });
    this.toolCalls = new client.Counter({
      name: 'procmesh_sidecar_tool_calls_total',
      help: 'Hosted tool calls served, by tool and outcome (ok, tool_error, cancelled, error code).',
      labelNames: ['tool', 'outcome'],
      registers: [registry],
    });
    this.toolLatency = new client.Histogram({
      name: 'procmesh_sidecar_tool_duration_seconds',
      help: "Time spent in a hosted tool's execute().",
      labelNames: ['tool'],
      buckets: LATENCY_BUCKETS,
      registers: [registry],
    });
    const build = new client.Gauge({
      name: 'procmesh_sidecar_build_info',
      help: 'The SDK serving this sidecar: language, version, runtime.',
      labelNames: ['sdk', 'version', 'runtime', 'grpc'],
      registers: [registry],
    });
    build.set({ sdk: 'node', version, runtime: `node ${process.versions.node}`, grpc: grpcVersion }, 1);
    client.collectDefaultMetrics({ register: registry });
  }

  /** Count one hook call, or one part of an output stream (its session counts at its end,
   * `observeSession`), and time it (`hook`: the camelCase name of the hook table). */
  observe(processor, hook, outcome, seconds) {
    const name = SNAKE.get(hook) || hook;
    if (name === STREAM_HOOK) this.streamParts.inc({ processor, outcome });
    else this.hookCalls.inc({ processor, hook: name, outcome });
    this.hookLatency.observe({ processor, hook: name }, seconds);
  }

  /** Count one output-stream session of `processor` as one hook call. */
  observeSession(processor, outcome) {
    this.hookCalls.inc({ processor, hook: STREAM_HOOK, outcome });
  }

  /** Count one hosted tool call and time it. */
  observeTool(tool, outcome, seconds) {
    this.toolCalls.inc({ tool, outcome });
    this.toolLatency.observe({ tool }, seconds);
  }
}

/** The outcome label of a hook that threw `err` (the status code it ends the call with). */
function outcomeOf(err, signal) {
  if (signal && signal.aborted) return 'cancelled'; // the call was cancelled or its deadline passed
  if (err && typeof err.outcome === 'string') return err.outcome; // a tool's error (./tools ToolRaised)
  const code = err && typeof err.code === 'number' ? err.code : status.INTERNAL;
  return CODE_NAMES.get(code) || 'internal';
}

/** Serve `registry` on http://host:port/metrics; resolves to the listening http.Server. */
function serveMetrics(registry, port, host) {
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || (req.url || '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found: GET /metrics\n');
      return;
    }
    registry.metrics().then(
      (body) => res.writeHead(200, { 'Content-Type': registry.contentType }).end(body),
      (err) => res.writeHead(500, { 'Content-Type': 'text/plain' }).end(`${err && err.message}\n`),
    );
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.removeListener('error', reject);
      resolve(server);
    });
  });
}

module.exports = { LATENCY_BUCKETS, SidecarMetrics, outcomeOf, serveMetrics };
