'use strict';
// ProcessorServer: hosts processors over gRPC (TCP and unix sockets) with grpc.health.v1, and
// serve()/run(), its lifecycle from the command line. The twin of the Python SDK's
// procmesh/_server.py: same RPC semantics, status codes and response shapes; see
// proto/README.md for the contract. What each RPC does lives in ./servicer (unary hooks, from
// the hook table), ./stream (the output stream) and ./effects (encoding what a hook left).

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const { HealthImplementation } = require('grpc-health-check');

const { SERVICE_NAME, loadContract } = require('./contract');
const { quote } = require('./effects');
const { rawService } = require('./guard');
const { Hosted, Servicer } = require('./servicer');

const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

// -- logging -----------------------------------------------------------------------------------

const LEVELS = { DEBUG: 10, INFO: 20, WARNING: 30, WARN: 30, ERROR: 40, CRITICAL: 50 };

function makeLogger(level) {
  const min = LEVELS[String(level || 'INFO').toUpperCase()] ?? 20;
  const emit = (name, args) => {
    if (LEVELS[name] >= min) console.error(new Date().toISOString(), name, 'procmesh:', ...args);
  };
  return {
    debug: (...a) => emit('DEBUG', a),
    info: (...a) => emit('INFO', a),
    warn: (...a) => emit('WARNING', a),
    error: (...a) => emit('ERROR', a),
  };
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
 * A gRPC server hosting one or more processors, with grpc.health.v1.
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
    if (!hosted.size) throw new TypeError('a ProcessorServer needs at least one processor');
    this._hosted = hosted;
    this._requested = options.addresses || (options.address ? [options.address] : ['127.0.0.1:0']);
    this._credentials = options.credentials || grpc.ServerCredentials.createInsecure();
    this._maxBytes = options.maxMessageBytes || DEFAULT_MAX_MESSAGE_BYTES;
    this.log = options.logger || makeLogger(options.logLevel);
    this._server = null;
    this._health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE_NAME]: 'NOT_SERVING' });
    this.addresses = [];
  }

  /** The ids of the hosted processors. */
  get processorIds() {
    return [...this._hosted.keys()];
  }

  /** Bind the addresses (Describe answers at once), run every setup(), then report SERVING. */
  async start() {
    const server = new grpc.Server({
      'grpc.max_receive_message_length': this._maxBytes,
      'grpc.max_send_message_length': this._maxBytes,
    });
    this._servicer = new Servicer(this._hosted, this.log);
    // Requests stay Buffers until the handlers decode them (./guard): undecodable is INVALID_ARGUMENT.
    const { service, decoders } = rawService(loadContract().ProcessorService.service);
    server.addService(service, this._servicer.handlers(decoders));
    this._health.addToServer(server);
    this._server = server;
    try {
      for (const address of this._requested) {
        if (address.startsWith('unix:')) {
          const file = unixPath(address);
          fs.mkdirSync(path.dirname(file) || '.', { recursive: true });
          fs.rmSync(file, { force: true }); // a stale socket from a previous run
          await bind(server, address, this._credentials);
          fs.chmodSync(file, 0o660);
          this.addresses.push(address);
        } else {
          const port = await bind(server, address, this._credentials);
          this.addresses.push(`${address.slice(0, address.lastIndexOf(':'))}:${port}`);
        }
      }
      for (const entry of this._hosted.values()) {
        if (typeof entry.processor.setup === 'function') await entry.processor.setup();
      }
    } catch (err) {
      await this.stop(0); // a failed start leaves nothing bound
      throw err;
    }
    this._servicer.ready = true;
    this._health.setStatus('', 'SERVING');
    this._health.setStatus(SERVICE_NAME, 'SERVING');
    this.log.info(`serving processors ${JSON.stringify(this.processorIds)} on ${this.addresses.join(', ')}`);
    return this;
  }

  /** Report NOT_SERVING, let in-flight calls finish within `graceSeconds`, then tear down. */
  async stop(graceSeconds = 5) {
    const server = this._server;
    if (server === null) return;
    this._server = null;
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
    if (this._servicer) this._servicer.ready = false;
    for (const entry of this._hosted.values()) {
      try {
        if (typeof entry.processor.teardown === 'function') await entry.processor.teardown();
      } catch (err) {
        this.log.error(`teardown of ${entry.id} failed`, err);
      }
    }
    for (const address of this.addresses) {
      if (address.startsWith('unix:')) fs.rmSync(unixPath(address), { force: true });
    }
  }
}

// -- serve / run -------------------------------------------------------------------------------------

/**
 * Settings from the environment (PROCMESH_LISTEN, PROCMESH_GRACE_SECONDS, PROCMESH_LOG_LEVEL,
 * PROCMESH_PARENT_PID, PROCMESH_TLS_*), overridden by flags (--listen ADDR, repeatable;
 * --grace-seconds S; --log-level L; --parent-pid N; --tls-cert/--tls-key/--tls-client-ca).
 * Unknown flags are left alone.
 */
function settingsFromArgs(argv = process.argv.slice(2), env = process.env) {
  const settings = { addresses: ['127.0.0.1:50051'], graceSeconds: 10, logLevel: 'INFO' };
  if (env.PROCMESH_LISTEN) {
    const raw = env.PROCMESH_LISTEN.trim();
    settings.addresses = raw.startsWith('[') ? JSON.parse(raw) : [raw];
  }
  if (env.PROCMESH_GRACE_SECONDS) settings.graceSeconds = Number(env.PROCMESH_GRACE_SECONDS);
  if (env.PROCMESH_LOG_LEVEL) settings.logLevel = env.PROCMESH_LOG_LEVEL;
  if (env.PROCMESH_PARENT_PID) settings.parentPid = Number(env.PROCMESH_PARENT_PID);
  for (const [key, name] of [['tlsCert', 'PROCMESH_TLS_CERT'], ['tlsKey', 'PROCMESH_TLS_KEY'], ['tlsClientCa', 'PROCMESH_TLS_CLIENT_CA']]) {
    if (env[name]) settings[key] = env[name];
  }
  const listen = [];
  const flags = {
    '--listen': (v) => listen.push(v),
    '--grace-seconds': (v) => (settings.graceSeconds = Number(v)),
    '--log-level': (v) => (settings.logLevel = v),
    '--parent-pid': (v) => (settings.parentPid = Number(v)),
    '--tls-cert': (v) => (settings.tlsCert = v),
    '--tls-key': (v) => (settings.tlsKey = v),
    '--tls-client-ca': (v) => (settings.tlsClientCa = v),
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    if (!(name in flags)) continue;
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) throw new Error(`${name} needs a value`);
    flags[name](value);
  }
  if (listen.length) settings.addresses = listen;
  return settings;
}

function tlsCredentials({ tlsCert, tlsKey, tlsClientCa }) {
  if (!tlsCert && !tlsKey) return undefined;
  if (!(tlsCert && tlsKey)) throw new Error('TLS needs both --tls-cert and --tls-key');
  const ca = tlsClientCa ? fs.readFileSync(tlsClientCa) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ private_key: fs.readFileSync(tlsKey), cert_chain: fs.readFileSync(tlsCert) }], Boolean(ca));
}

/**
 * Start a ProcessorServer for `processors` and return it once SERVING.
 *
 * Options: `address` or `addresses` (default: --listen / PROCMESH_LISTEN / 127.0.0.1:50051),
 * `graceSeconds`, `logLevel`, `parentPid` (stop when that parent is gone), `credentials`,
 * `maxMessageBytes`, `handleSignals` (default true: SIGTERM/SIGINT drain within the grace
 * period, then the process exits).
 */
async function serve(processors, options = {}) {
  const settings = settingsFromArgs();
  const opts = { ...settings, ...options };
  if (options.address) opts.addresses = [options.address];
  if (!opts.credentials) opts.credentials = tlsCredentials(opts);
  const server = new ProcessorServer(processors, opts);
  await server.start();
  const grace = opts.graceSeconds ?? 10;
  let stopping = null;
  const shutdown = (why) => {
    if (stopping) return stopping;
    server.log.info(`${why}; stopping (grace ${grace}s)`);
    stopping = server.stop(grace).then(() => {
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

/** Serve until SIGTERM/SIGINT with every setting from the command line and environment (procmesh.run). */
function run(processors, overrides = {}) {
  return serve(processors, overrides).catch((err) => {
    console.error('procmesh: error:', err && err.stack ? err.stack : err);
    process.exit(1);
  });
}

module.exports = { DEFAULT_MAX_MESSAGE_BYTES, ProcessorServer, run, serve, settingsFromArgs };
