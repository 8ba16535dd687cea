'use strict';
// Fused requests and rewinds, the pure parts: the announced signal chunk, the rewind history and
// runFused's chain rule. The wire behaviour against the Python SDK is in
// tests/e2e/node/test_fusion_parity.py.
const test = require('node:test');
const assert = require('node:assert/strict');

const { announced } = require('../lib/chain');
const { InvalidInputError, InternalError } = require('../lib/errors');
const { runFused } = require('../lib/fused');
const { History } = require('../lib/rewind');

test('the announced chunk carries the canonical type, the default tag and the signal id', () => {
  const signal = { type: 'user-message', contents: 'hi', transient: true, metadata: { k: 1 } };
  const chunk = announced(signal);
  assert.equal(chunk.type, 'data-signal');
  assert.equal(chunk.transient, true);
  assert.deepEqual(Object.keys(chunk.data), ['id', 'type', 'tagName', 'createdAt', 'transient', 'contents']);
  assert.equal(chunk.data.id, signal.id); // the signal of the effects gets the chunk's id
  assert.equal(chunk.data.type, 'user');
  assert.equal(chunk.data.tagName, 'user');
  assert.ok(!('metadata' in chunk.data));
  assert.equal(announced({ contents: 'x', id: 'given' }).data.id, 'given');
  assert.equal(announced({ contents: 'x', tagName: 'note' }).data.tagName, 'note');
});

function stage() {
  return { args: { state: {} }, streamParts: [], error: '' };
}

function take(s, part) {
  s.args.state.n = (s.args.state.n ?? 0) + 1;
  s.streamParts.push(part.seq);
}

test('a rewind restores the batch and replays the parts before the rewind point', async () => {
  const s = stage();
  const history = new History([s]);
  for (const batch of [[{ seq: 1 }, { seq: 2 }], [{ seq: 3 }, { seq: 4 }, { seq: 5 }]]) {
    history.keep(batch);
    batch.forEach((p) => take(s, p));
  }
  s.error = 'INTERNAL: failed';
  const replayed = [];
  const replay = async (kept) => {
    replayed.push(kept.map((p) => p.seq));
    kept.forEach((p) => take(s, p));
  };
  await history.rewind(4, replay);
  assert.deepEqual(replayed, [[3]]);
  assert.deepEqual(s.args.state, { n: 3 });
  assert.deepEqual(s.streamParts, [1, 2, 3]);
  assert.equal(s.error, '');
  await history.rewind(99, replay); // past every part: nothing withdrawn
  assert.deepEqual(s.args.state, { n: 3 });
  history.commit(3);
  await assert.rejects(history.rewind(2, replay), InvalidInputError);
});

test('a fused chain runs on while each passes, and a later failure is its outcome', async () => {
  const calls = [];
  const answers = {
    a: () => ({ effects: { signals: [] } }),
    b: () => ({ replace_messages: true, messages: [{ id: 'm' }], effects: { signals: [] } }),
    c: () => {
      throw new InternalError('c broke');
    },
  };
  const one = async (hosted) => {
    calls.push(hosted.id);
    return answers[hosted.id]();
  };
  const ran = await runFused(one, { id: 'a' }, [{ id: 'b' }, { id: 'c' }], [{}, {}]);
  assert.deepEqual(calls, ['a', 'b']); // b rewrote: c did not run
  assert.equal(ran.replace_messages, true);
  assert.deepEqual(ran.effects.fused, [{ effects: { signals: [] } }]);
  calls.length = 0;
  const failed = await runFused(one, { id: 'a' }, [{ id: 'c' }, { id: 'b' }], [{}, {}]);
  assert.deepEqual(calls, ['a', 'c']);
  assert.deepEqual(failed.effects.fused, [{ error: 'INTERNAL: c broke' }]);
});

test('a fused chain stops after a hook that set a request-context value', async () => {
  const calls = [];
  const answers = {
    a: () => ({ effects: { signals: [], request_context_updates: { fields: { tier: { string_value: 'gold' } } } } }),
    b: () => ({ effects: { signals: [] } }),
  };
  const one = async (hosted) => {
    calls.push(hosted.id);
    return answers[hosted.id]();
  };
  const ran = await runFused(one, { id: 'a' }, [{ id: 'b' }], [{}]);
  assert.deepEqual(calls, ['a']); // b would not see the value: the orchestrator calls it itself
  assert.ok(ran.effects.request_context_updates);
});
