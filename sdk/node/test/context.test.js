'use strict';
// requestContext.set: a hook's request-context values, recorded for its effects
// (HookEffects.request_context_updates). The run-wide behaviour is in
// tests/e2e/tools/test_context_values.py.
const test = require('node:test');
const assert = require('node:assert/strict');

const { fromStruct } = require('../lib/convert');
const { fillEffects } = require('../lib/effects');
const { HookEffects, RequestContext } = require('../lib/processor');

test('requestContext.set records the value for the hook\'s effects; removals and non-JSON values throw', () => {
  const effects = new HookEffects('tagger');
  const ctx = new RequestContext({ tenant: 'acme' }, effects.contextUpdates);
  ctx.set('tier', 'gold');
  assert.equal(ctx.get('tier'), 'gold');
  assert.deepEqual(Object.fromEntries(effects.contextUpdates), { tier: 'gold' });
  const out = fillEffects(effects);
  assert.deepEqual(fromStruct(out.request_context_updates), { tier: 'gold' });
  assert.throws(() => ctx.delete('tenant'), /cannot remove/);
  assert.throws(() => ctx.clear(), /cannot remove/);
  assert.throws(() => ctx.set('f', () => 1), /must be JSON/);
  assert.equal(fillEffects(new HookEffects('quiet')).request_context_updates, undefined);
  const stream = new RequestContext({ tenant: 'acme' }, null);
  assert.throws(() => stream.set('tier', 'gold'), /processOutputStream cannot set/);
  const plain = new RequestContext({ a: 1 }); // built by hand: a plain Map
  plain.set('b', 2);
  plain.delete('a');
  assert.deepEqual(plain.toJSON(), { b: 2 });
});
