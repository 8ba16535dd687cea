'use strict';
// ProcessorServer: hosts processors over gRPC (TCP and unix sockets) with grpc.health.v1, and
// serve()/run(), its lifecycle from the command line. The twin of the Python SDK's
// procmesh/_server.py: same RPC semantics, status codes and response shapes; see
// proto/README.md for the contract. What each RPC does lives in ./servicer (unary hooks, from
// the hook table), ./stream (the output stream) and ./effects (encoding what a hook left).

const { AsyncLocalStorage } = require('async_hooks');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { ReflectionService } = require('@grpc/reflection');
const { HealthImplementation, protoPath: healthProtoPath } = require('grpc-health-check');

const { LOADER_OPTIONS, SERVICE_NAME, loadContract, protoDir } = require('./contract');
const { quote } = require('./effects');
const { rawService } = require('./guard');
const { SidecarMetrics, outcomeOf, serveMetrics } = require('./metrics');
const { LEVELS, LOG_FORMATS, SettingsError, checkBindable, idleSettings, overriddenTls, settingsFromArgs, usage } = require('./settings');
const { checkEnvironment } = require('./environment');
const { Hosted, Servicer, SUSPENSION } = require('./servicer');
const { HostedTool } = require('./tools');
const tracing = require('./tracing');
const { version } = require('../package.json');

const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

// The Python SDK's server options (procmesh/_server.py): close each connection after about 5
// minutes with a GOAWAY, so clients reconnect and re-resolve and autoscaled replicas get calls;
// calls in flight get 10 minutes. Keepalive pings from clients (every 30 s) need no permit here:
// grpc-js servers answer pings at any rate and never send GOAWAY "too_many_pings".
const SERVER_OPTIONS = {
  'grpc.max_connection_age_ms': 5 * 60_000,
  'grpc.max_connection_age_grace_ms': 10 * 60_000,
};

// Reflection lists what the Python SDK's lists: the contract, health and reflection itself.
const REFLECTED = [SERVICE_NAME, 'grpc.health.v1.Health', 'grpc.reflection.v1alpha.ServerReflection'];

function reflectionService() {
  const reflectionProtos = path.join(path.dirname(require.resolve('@grpc/reflection')), '..', 'proto');
  const load = (file, dir) => protoLoader.loadSync(file, { ...LOADER_OPTIONS, includeDirs: [dir] });
  const definitions = {
    ...load('procmesh/v1/processor.proto', protoDir()),
    ...load('health/v1/health.proto', path.resolve(path.dirname(healthProtoPath), '..', '..')),
    ...load('grpc/reflection/v1alpha/reflection.proto', reflectionProtos),
  };
  return new ReflectionService(definitions, { services: REFLECTED });
}

// -- logging -----------------------------------------------------------------------------------

/** The run a hook call serves, so every line logged while it runs names it (as Python's RUN_ID). */
const logContext = new AsyncLocalStorage();

function logText(arg) {
  if (arg instanceof Error) return arg.stack || String(arg);
  return typeof arg === 'string' ? arg : JSON.stringify(arg);
}

/**
 * A logger writing to stderr from `level` up: text lines, or (format 'json') one JSON object per
 * line with the Python SDK's fields: time, level, logger, message, and run_id inside a hook call.
 */
function makeLogger(level, format = 'text') {
  const min = LEVELS[String(level || 'INFO').toUpperCase()] ?? 20;
  const emit = (name, args) => {
    if (LEVELS[name] < min) return;
    if (format === 'json') {
      const entry = { time: new Date().toISOString(), level: name, logger: 'procmesh', message: args.map(logText).join(' ') };
      const ctx = logContext.getStore();
      if (ctx && ctx.runId) entry.run_id = ctx.runId;
      process.stderr.write(`${JSON.stringify(entry)}\n`);
    } else {
      console.error(new Date().toISOString(), name, 'procmesh:', ...args);
    }
  };
  return {
    debug: (...a) => emit('DEBUG', a),
    info: (...a) => emit('INFO', a),
    warn: (...a) => emit('WARNING', a),
    error: (...a) => emit('ERROR', a),
  };
}

/** The Servicer, timing and counting every hook call (the SDK instruments; authors don't). */
class MeteredServicer extends Servicer {
  constructor(hosted, log, metrics, tools) {
    super(hosted, log, tools);
    this.metrics = metrics;
  }

  async runTool(tool, args, ctx) {
    const started = process.hrtime.bigint();
    let outcome = 'ok';
    try {
      const done = await logContext.run({ runId: ctx.runId }, () => super.runTool(tool, args, ctx));
      if (ctx[SUSPENSION] && ctx[SUSPENSION].asked) outcome = 'suspended';
      return done;
    } catch (err) {
      outcome = outcomeOf(err, ctx.abortSignal);
      throw err;
    } finally {
      this.metrics.observeTool(tool.name, outcome, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }

  async callHook(hosted, hook, args, effects, quiet = false) {
    if (quiet) return super.callHook(hosted, hook, args, effects, quiet); // a replay: the call it repeats was counted
    const started = process.hrtime.bigint();
    let outcome = 'ok';
    try {
      const result = await logContext.run({ runId: args.runId }, () => super.callHook(hosted, hook, args, effects));
      if (effects.abort) outcome = 'abort';
      return result;
    } catch (err) {
      outcome = outcomeOf(err, args.abortSignal);
      throw err;
    } finally {
      this.metrics.observe(hosted.id, hook, outcome, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }
}

// -- the server ----------------------------------------------------------------------------------

function unixPath(address) {
  return address.startsWith('unix://') ? address.slice('unix://'.length) : address.slice('unix:'.length);
}

function bind(server, address, credentials) {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, credentials, (err, port) => (err ? reject(err) : resolve(port)));
  });
}

/**
 * A gRPC server hosting processors and tools (`options.tools`, ./tools), with grpc.health.v1.
 *
 * `addresses`: `host:port` (port 0 picks a free port) or `unix:///path.sock`; `start()` fills
 * `this.addresses` with the bound ones.
 */
class ProcessorServer {
  constructor(processors, options = {}) {
    const hosted = new Map();
    for (const proc of processors || []) {
      const entry = new Hosted(proc);
      if (hosted.has(entry.id)) throw new TypeError(`two processors share the id ${quote(entry.id)}`);
      if (!entry.hooks.size) throw new TypeError(`processor ${quote(entry.id)} implements no hook`);
      hosted.set(entry.id, entry);
    }
    const tools = new Map();
    for (const tool of options.tools || []) {
      const entry = new HostedTool(tool);
      if (tools.has(entry.name)) throw new TypeError(`two tools share the name ${quote(entry.name)}`);
      tools.set(entry.name, entry);
    }
    if (!hosted.size && !tools.size) throw new TypeError('a ProcessorServer needs at least one processor or tool');
    this._hosted = hosted;
    this._tools = tools;
    this._requested = options.addresses || (options.address ? [options.address] : ['127.0.0.1:0']);
    this._credentials = options.credentials || grpc.ServerCredentials.createInsecure();
    this._maxBytes = options.maxMessageBytes || DEFAULT_MAX_MESSAGE_BYTES;
    this.log = options.logger || makeLogger(options.logLevel, options.logFormat);
    /** The SDK's metrics (`metrics.registry` is a prom-client Registry); served on `metricsPort`. */
    this.metrics = new SidecarMetrics(options.registry);
    this._metricsPort = options.metricsPort;
    this._metricsHost = options.metricsHost;
    this.metricsServer = null;
    this._server = null;
    this._health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE_NAME]: 'NOT_SERVING' });
    this.addresses = [];
  }

  /** Where the metrics listener binds: `metricsHost`, else where gRPC binds (loopback for unix sockets only). */
  get metricsHost() {
    if (this._metricsHost) return this._metricsHost;
    const tcp = this._requested.find((a) => !a.startsWith('unix:'));
    return tcp ? tcp.slice(0, tcp.lastIndexOf(':')).replace(/^\[|\]$/g, '') : '127.0.0.1';
  }

  /** The ids of the hosted processors. */
  get processorIds() {
    return [...this._hosted.keys()];
  }

  /** The names of the hosted tools. */
  get toolNames() {
    return [...this._tools.keys()];
  }

  /** Bind the addresses (Describe answers at once), run every setup(), then report SERVING. */
  async start() {
    const server = new grpc.Server({
      ...SERVER_OPTIONS,
      'grpc.max_receive_message_length': this._maxBytes,
      'grpc.max_send_message_length': this._maxBytes,
    });
    this._servicer = new MeteredServicer(this._hosted, this.log, this.metrics, this._tools);
    // Requests stay Buffers until the handlers decode them (./guard): undecodable is INVALID_ARGUMENT.
    const { service, decoders } = rawService(loadContract().ProcessorService.service);
    server.addService(service, this._servicer.handlers(decoders));
    this._health.addToServer(server);
    reflectionService().addToServer(server);
    this._server = server;
    try {
      for (const address of this._requested) {
        if (address.startsWith('unix:')) {
          const file = unixPath(address);
          try {
            fs.mkdirSync(path.dirname(file) || '.', { recursive: true });
            fs.rmSync(file, { force: true }); // a stale socket from a previous run
            await bind(server, address, this._credentials);
            fs.chmodSync(file, 0o660);
          } catch (err) {
            // as a TCP address that cannot be bound (checkBindable): one line, exit 2 under run()
            throw new SettingsError(`cannot listen on ${address}: ${err && err.message ? err.message : err}`);
          }
          this.addresses.push(address);
        } else {
          const port = await bind(server, address, this._credentials);
          this.addresses.push(`${address.slice(0, address.lastIndexOf(':'))}:${port}`);
        }
      }
      if (this._metricsPort !== undefined && this._metricsPort !== null) {
        const host = this.metricsHost;
        this.metricsServer = await serveMetrics(this.metrics.registry, this._metricsPort, host);
        this.log.info(`metrics on http://${host}:${this.metricsServer.address().port}/metrics`);
      }
      for (const entry of this._hosted.values()) {
        if (typeof entry.processor.setup === 'function') await entry.processor.setup();
      }
      for (const entry of this._tools.values()) {
        if (typeof entry.tool.setup === 'function') await entry.tool.setup();
      }
    } catch (err) {
      await this.stop(0); // a failed start leaves nothing bound
      throw err;
    }
    this._servicer.ready = true;
    this._health.setStatus('', 'SERVING');
    this._health.setStatus(SERVICE_NAME, 'SERVING');
    this.log.info(`serving processors ${JSON.stringify(this.processorIds)} and tools ${JSON.stringify(this.toolNames)} on ${this.addresses.join(', ')}`);
    return this;
  }

  /** Report NOT_SERVING, let in-flight calls finish within `graceSeconds`, then tear down. */
  async stop(graceSeconds = 5) {
    const server = this._server;
    if (server === null) return;
    this._server = null;
    if (this.metricsServer) {
      this.metricsServer.close();
      this.metricsServer = null;
    }
    // Calls that arrive while draining answer UNAVAILABLE (NotReadyError), so clients retry them
    // on another replica; the ones in flight finish within the grace period.
    if (this._servicer) this._servicer.ready = false;
    this._health.setStatus('', 'NOT_SERVING');
    this._health.setStatus(SERVICE_NAME, 'NOT_SERVING');
    await new Promise((resolve) => {
      const timer = setTimeout(() => {
        server.forceShutdown();
        resolve();
      }, Math.max(0, graceSeconds) * 1000);
      server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    for (const entry of this._hosted.values()) {
      try {
        if (typeof entry.processor.teardown === 'function') await entry.processor.teardown();
      } catch (err) {
        this.log.error(`teardown of ${entry.id} failed`, err);
      }
    }
    for (const entry of this._tools.values()) {
      try {
        if (typeof entry.tool.teardown === 'function') await entry.tool.teardown();
      } catch (err) {
        this.log.error(`teardown of tool ${entry.name} failed`, err);
      }
    }
    for (const address of this.addresses) {
      if (address.startsWith('unix:')) fs.rmSync(unixPath(address), { force: true });
    }
    await tracing.flush(); // export the spans of the calls that just drained (a no-op when off)
  }
}

// -- serve / run -------------------------------------------------------------------------------------

function tlsCredentials({ tlsCert, tlsKey, tlsClientCa }) {
  if (!tlsCert && !tlsKey) {
    // a client CA alone would serve plaintext, requiring no client certificate: never mTLS silently off
    if (tlsClientCa) throw new SettingsError('--tls-client-ca (mTLS) needs --tls-cert and --tls-key: the sidecar must serve TLS first');
    return undefined;
  }
  if (!(tlsCert && tlsKey)) throw new SettingsError('TLS needs both --tls-cert and --tls-key');
  const ca = tlsClientCa ? fs.readFileSync(tlsClientCa) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ private_key: fs.readFileSync(tlsKey), cert_chain: fs.readFileSync(tlsCert) }], Boolean(ca));
}

/**
 * Start a ProcessorServer for `processors` (and `options.tools`) and return it once SERVING.
 *
 * Options: `address` or `addresses` (default: --listen / PROCMESH_LISTEN / 127.0.0.1:50051),
 * `graceSeconds`, `logLevel`, `logFormat` ('text' or 'json'), `metricsPort`, `metricsHost`,
 * `parentPid` (stop when that parent is gone), `credentials`, `maxMessageBytes`, `extraFlags`
 * (the program's own flags, accepted on the command line), `handleSignals` (default true:
 * SIGTERM/SIGINT drain within the grace period, then the process exits).
 */
async function serve(processors, options = {}) {
  const settings = settingsFromArgs(process.argv.slice(2), process.env, { extraFlags: options.extraFlags || [] });
  if (settings.action === 'help') {
    process.stdout.write(`${usage(path.basename(process.argv[1] || 'procmesh'), options.extraFlags)}\n`);
    process.exit(0);
  }
  if (settings.action === 'version') {
    process.stdout.write(`${path.basename(process.argv[1] || 'procmesh')} (@procmesh/sdk) ${version}\n`);
    process.exit(0);
  }
  const opts = { ...settings, ...options };
  if (options.address) opts.addresses = [options.address];
  if (!opts.credentials) opts.credentials = tlsCredentials(opts);
  const server = new ProcessorServer(processors, opts);
  const foreign = checkEnvironment('node-sidecar', process.env).note();
  if (foreign) server.log.info(foreign); // another component's variables: named, not read
  for (const line of idleSettings(opts, process.env)) server.log.warn(line); // given, doing nothing
  if (options.credentials) for (const line of overriddenTls(opts)) server.log.warn(line); // the program's win
  tracing.setup('procmesh-node-sidecar', server.log); // OTEL_* decide; off by default
  // grpc-js reports a failed bind with a log line of its own and a vague error: a test bind
  // first says which address and why, on one line.
  for (const address of opts.addresses) await checkBindable(address);
  if (opts.metricsPort) await checkBindable(`${server.metricsHost}:${opts.metricsPort}`);
  await server.start();
  const grace = opts.graceSeconds ?? 10;
  let stopping = null;
  const shutdown = (why) => {
    if (stopping) return stopping;
    server.log.info(`${why}; stopping (grace ${grace}s)`);
    stopping = server.stop(grace).then(async () => {
      await tracing.shutdown().catch((err) => server.log.warn('tracing shutdown failed', err));
      if (opts.handleSignals !== false) process.exit(0);
    });
    return stopping;
  };
  if (opts.handleSignals !== false) {
    for (const sig of ['SIGTERM', 'SIGINT']) process.once(sig, () => shutdown(sig));
  }
  if (opts.parentPid) {
    const watch = setInterval(() => {
      if (process.ppid !== opts.parentPid) {
        clearInterval(watch);
        shutdown(`parent process ${opts.parentPid} is gone`);
      }
    }, 500);
    watch.unref();
  }
  return server;
}

/**
 * Serve until SIGTERM/SIGINT with every setting from the command line and environment (procmesh.run).
 * A bad flag or setting prints one line and exits with status 2; any other failure, its stack and 1.
 */
function run(processors, overrides = {}) {
  return serve(processors, overrides).catch((err) => {
    if (err instanceof SettingsError) {
      console.error(`${path.basename(process.argv[1] || 'procmesh')}: error: ${err.message}`);
      process.exit(2);
    }
    console.error('procmesh: error:', err && err.stack ? err.stack : err);
    process.exit(1);
  });
}

module.exports = { DEFAULT_MAX_MESSAGE_BYTES, LOG_FORMATS, ProcessorServer, SettingsError, makeLogger, run, serve, settingsFromArgs, usage };
