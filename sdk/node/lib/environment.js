'use strict';
// Every procmesh component's PROCMESH_* variables (environment.json, a copy of the Python SDK's
// procmesh.environment): a variable no component reads is a start-up error naming it and the
// closest known name; another component's (a Kubernetes ConfigMap shared through envFrom) is only
// named in one log line at start.

const { components, prefixes, renamed } = require('./environment.json');

const PREFIX = 'PROCMESH_';

function knownTo(component, name) {
  return components[component].includes(name) || (prefixes[component] || []).some((p) => name.startsWith(p));
}

function distance(a, b) {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    row = next;
  }
  return row[b.length];
}

function closest(name, candidates) {
  let best = null;
  let bestDistance = Infinity;
  for (const candidate of [...candidates].sort()) {
    const d = distance(name, candidate);
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  // close enough to be a typo: at most a quarter of the name's characters differ
  return best !== null && bestDistance <= Math.max(2, Math.floor(name.length / 4)) ? best : null;
}

/**
 * Sort `env`'s PROCMESH_* variables for `component` ('node-sidecar'): `unknown` (no component reads
 * them: `error()` is the one-line message), `foreign` (another component's: `note()`).
 */
function checkEnvironment(component, env = process.env) {
  const unknown = [];
  const foreign = [];
  for (const name of Object.keys(env).sort()) {
    if (!name.startsWith(PREFIX) || knownTo(component, name)) continue;
    if (!(name in renamed) && Object.keys(components).some((other) => knownTo(other, name))) foreign.push(name);
    else unknown.push(name);
  }
  const all = new Set(Object.values(components).flat());
  return {
    unknown,
    foreign,
    error() {
      if (!unknown.length) return null;
      const described = unknown.map((name) => {
        if (name in renamed) return `${name} (renamed ${renamed[name]})`;
        const near = closest(name, components[component]) || closest(name, all);
        return near ? `${name} (did you mean ${near}?)` : name;
      });
      const many = described.length > 1;
      return `unknown environment variable${many ? 's' : ''} ${described.join(', ')}: no procmesh component reads ${many ? 'them' : 'it'} (unset it, or fix its name; the variables are listed in docs/running.md)`;
    },
    note() {
      if (!foreign.length) return null;
      return `${foreign.join(', ')}: other procmesh components' settings (a shared ConfigMap?), not read by the ${component}`;
    },
  };
}

module.exports = { checkEnvironment };
