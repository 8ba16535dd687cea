'use strict';
// The sidecar's settings: flags and PROCMESH_* variables, parsed strictly (the twin of the Python
// SDK's settings_parser / settings_from_args), and the test bind that turns an address in use
// into one line.

const net = require('net');
const { checkEnvironment } = require('./environment');

const LEVELS = { DEBUG: 10, INFO: 20, WARNING: 30, WARN: 30, ERROR: 40, CRITICAL: 50 };
const LOG_FORMATS = ['text', 'json'];

/** A bad flag or setting: `run()` prints its message on one line and exits with status 2. */
class SettingsError extends Error {
  constructor(message) {
    super(message);
    this.name = 'SettingsError';
  }
}

// Every flag: [name, settings key, parse, help]. The environment variable of each is PROCMESH_
// and the flag's name in capitals (--metrics-port: PROCMESH_METRICS_PORT), as in Python.
const number = (name) => (v) => {
  const n = Number(v);
  if (v === '' || !Number.isFinite(n)) throw new SettingsError(`${name}: not a number: ${JSON.stringify(v)}`);
  return n;
};
const port = (name) => (v) => {
  const n = number(name)(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new SettingsError(`${name}: not a port: ${JSON.stringify(v)}`);
  return n;
};
const choice = (name, values) => (v) => {
  const value = String(v).trim().toLowerCase();
  if (!values.includes(value)) throw new SettingsError(`${name}: must be one of ${values.join(', ')} (got ${JSON.stringify(v)})`);
  return value;
};
const level = (name) => (v) => {
  const value = String(v).trim().toUpperCase();
  if (!(value in LEVELS)) throw new SettingsError(`${name}: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (got ${JSON.stringify(v)})`);
  return value;
};
const text = (v) => v;
const FLAGS = [
  ['--listen', 'addresses', text, 'address to serve on (repeatable): host:port or unix:///path.sock'],
  ['--metrics-port', 'metricsPort', port('metrics_port'), 'serve Prometheus metrics on this port'],
  ['--metrics-host', 'metricsHost', text, 'interface of the metrics port (default: where gRPC binds)'],
  ['--grace-seconds', 'graceSeconds', number('grace_seconds'), 'time in-flight calls get after SIGTERM'],
  ['--log-level', 'logLevel', level('log_level'), 'DEBUG, INFO (default), WARNING, ERROR'],
  ['--log-format', 'logFormat', choice('log_format', LOG_FORMATS), 'text (default) or json: one JSON object per line'],
  ['--parent-pid', 'parentPid', number('parent_pid'), 'exit when this process is no longer the parent'],
  ['--tls-cert', 'tlsCert', text, 'PEM certificate: serve TLS'],
  ['--tls-key', 'tlsKey', text, 'PEM key of --tls-cert'],
  ['--tls-client-ca', 'tlsClientCa', text, 'PEM CA client certificates must chain to (mTLS)'],
];

function checkAddress(address) {
  if (address.startsWith('unix:')) {
    if (!address.replace(/^unix:(\/\/)?/, '')) throw new SettingsError(`listen: ${JSON.stringify(address)}: a unix address needs a path`);
    return address;
  }
  const at = address.lastIndexOf(':');
  const portText = address.slice(at + 1);
  if (at <= 0 || !/^\d+$/.test(portText) || Number(portText) > 65535) {
    throw new SettingsError(`listen: ${JSON.stringify(address)} is not host:port (e.g. 127.0.0.1:50051) or unix:///path.sock`);
  }
  return address;
}

function envAddresses(raw) {
  const value = raw.trim();
  if (!value.startsWith('[')) return [value];
  let list;
  try {
    list = JSON.parse(value);
  } catch {
    throw new SettingsError(`listen: not a JSON list of addresses: ${JSON.stringify(value.slice(0, 80))}`);
  }
  if (!Array.isArray(list) || !list.every((a) => typeof a === 'string')) throw new SettingsError('listen: PROCMESH_LISTEN must be a JSON list of strings');
  return list;
}

/** The --help text: every flag, and the rule for the environment. */
function usage(prog = 'procmesh-node-sidecar', extraFlags = []) {
  const rows = [...FLAGS.map(([name, , , help]) => [`${name} VALUE`, help]), ...extraFlags.map((f) => [`${f} VALUE`, 'the program\'s own']),
    ['--version', "show the SDK's version and exit"], ['--help', 'show this help and exit']];
  const width = Math.max(...rows.map(([f]) => f.length)) + 2;
  return [
    `usage: ${prog} [flags]`,
    '',
    'Serve procmesh processors over gRPC.',
    '',
    'flags:',
    ...rows.map(([f, h]) => `  ${f.padEnd(width)}${h}`),
    '',
    'Every flag has an environment variable: PROCMESH_ and the flag\'s name in capitals',
    '(--metrics-port: PROCMESH_METRICS_PORT; PROCMESH_LISTEN takes one address or a JSON list). Flags win.',
  ].join('\n');
}

/**
 * Settings from the environment (PROCMESH_LISTEN, PROCMESH_METRICS_PORT, PROCMESH_LOG_FORMAT, ...:
 * see FLAGS), overridden by flags (--listen ADDR, repeatable; --metrics-port N; --log-format json;
 * ...). An unknown flag, a value that does not parse, or a PROCMESH_ variable no procmesh component
 * reads (environment.js), throws a SettingsError: a misspelt flag or variable must not leave a
 * sidecar on its defaults. `extraFlags` names the program's own flags (each
 * takes a value), which are accepted and returned in `settings.extra`. `--help` and `--version`
 * set `settings.action`.
 */
function settingsFromArgs(argv = process.argv.slice(2), env = process.env, { extraFlags = [] } = {}) {
  const settings = { addresses: ['127.0.0.1:50051'], graceSeconds: 10, logLevel: 'INFO', logFormat: 'text', extra: {} };
  // A PROCMESH_ variable no procmesh component reads is a typo: never serve on the defaults it was
  // meant to change. Another component's (a shared ConfigMap) is named at start (`serve`).
  const unknown = checkEnvironment('node-sidecar', env).error();
  if (unknown) throw new SettingsError(unknown);
  for (const [name, key, parse] of FLAGS) {
    const variable = `PROCMESH_${name.slice(2).replace(/-/g, '_').toUpperCase()}`;
    if (env[variable] === undefined || env[variable] === '') continue;
    settings[key] = key === 'addresses' ? envAddresses(env[variable]) : parse(env[variable]);
  }
  const flags = new Map(FLAGS.map(([name, key, parse]) => [name, [key, parse]]));
  const listen = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--help' || arg === '-h') settings.action = 'help';
    else if (arg === '--version') settings.action = 'version';
    if (settings.action) return settings;
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    if (!flags.has(name) && !extraFlags.includes(name)) {
      throw new SettingsError(arg.startsWith('-') ? `unknown flag ${name} (--help lists them)` : `unexpected argument ${JSON.stringify(arg)}`);
    }
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) throw new SettingsError(`${name} needs a value`);
    if (!flags.has(name)) settings.extra[name.slice(2)] = value;
    else if (name === '--listen') listen.push(value);
    else {
      const [key, parse] = flags.get(name);
      settings[key] = parse(value);
    }
  }
  if (listen.length) settings.addresses = listen;
  settings.addresses.forEach(checkAddress);
  return settings;
}

/**
 * A line for each setting given that does nothing without another (a shared ConfigMap may set it on
 * purpose, so it is no error: `serve` logs each as a WARNING naming it and why; the Python SDK's
 * idle_settings says the same).
 */
function idleSettings(settings, env = process.env) {
  const lines = [];
  if (settings.metricsHost && (settings.metricsPort === undefined || settings.metricsPort === null)) {
    lines.push('--metrics-host (PROCMESH_METRICS_HOST) does nothing: no --metrics-port (PROCMESH_METRICS_PORT), so no metrics endpoint is served');
  }
  if (!(env.PROCMESH_MODEL_GATEWAY || '').trim()) {
    for (const variable of ['PROCMESH_MODEL_GATEWAY_KEY', 'PROCMESH_MODEL_GATEWAY_CA', 'PROCMESH_MODEL_GATEWAY_CERT', 'PROCMESH_MODEL_GATEWAY_CERT_KEY']) {
      if (env[variable]) lines.push(`${variable} does nothing: no PROCMESH_MODEL_GATEWAY, so hooks cannot call models`);
    }
  }
  return lines;
}

/**
 * A line for each TLS setting (--tls-cert, --tls-key, --tls-client-ca, or PROCMESH_TLS_CERT,
 * PROCMESH_TLS_KEY, PROCMESH_TLS_CLIENT_CA) a program's own `credentials` override: `serve`
 * serves with those and reads none of these, so it logs each as a WARNING naming it (a shared
 * ConfigMap may set them: no error).
 */
function overriddenTls(settings) {
  const lines = [];
  for (const [flag, key] of [['--tls-cert', 'tlsCert'], ['--tls-key', 'tlsKey'], ['--tls-client-ca', 'tlsClientCa']]) {
    const variable = `PROCMESH_${flag.slice(2).replace(/-/g, '_').toUpperCase()}`;
    if (settings[key]) lines.push(`${flag} (${variable}) is ignored: the program passes its own credentials to run() / serve(), which the sidecar serves with`);
  }
  return lines;
}

/** Throw a SettingsError now if a TCP address cannot be bound (in use, not an interface here). */
function checkBindable(address) {
  if (address.startsWith('unix:')) return Promise.resolve();
  const at = address.lastIndexOf(':');
  const port = Number(address.slice(at + 1));
  if (port === 0) return Promise.resolve();
  const host = address.slice(0, at).replace(/^\[|\]$/g, '');
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', (err) => reject(new SettingsError(`cannot listen on ${address}: ${err.code === 'EADDRINUSE' ? 'address already in use' : err.message}`)));
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve()));
  });
}

module.exports = { LEVELS, LOG_FORMATS, SettingsError, checkBindable, idleSettings, overriddenTls, settingsFromArgs, usage };
