'use strict';
// The message list's per-source views (SEED-GAPS B4) and the legacy flattened content.content (B6).
const test = require('node:test');
const assert = require('node:assert/strict');
const { MessageList, convert } = require('..');

const text = (id, role, words) => ({ id, role, content: { format: 2, parts: [{ type: 'text', text: words }] } });

test('get.input, get.response and get.remembered follow the sources the orchestrator sent', () => {
  const list = new MessageList(
    [text('h', 'user', 'old'), text('i', 'user', 'new'), text('r', 'assistant', 'answer'), text('x', 'user', 'unnamed')],
    { h: 'memory', i: 'input', r: 'response' },
  );
  list.add(text('added', 'user', 'by the hook'));
  assert.deepStrictEqual(list.get.remembered.db().map((m) => m.id), ['h']);
  assert.deepStrictEqual(list.get.input.db().map((m) => m.id), ['i', 'x']);
  assert.deepStrictEqual(list.get.response.db().map((m) => m.id), ['r']);
  assert.deepStrictEqual(list.get.all.db().map((m) => m.id), ['h', 'i', 'r', 'x', 'added']);
});

test('a decoded message reads its text as content.content, which is not in its JSON', () => {
  const wire = convert.messageToProto({ id: 'm', role: 'user', content: { parts: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] } });
  const message = convert.messageFromProto(wire);
  assert.strictEqual(message.content.content, 'a\nb');
  assert.ok(!('content' in JSON.parse(JSON.stringify(message.content))));
  message.content.content = 'set by a hook';
  assert.strictEqual(message.content.content, 'set by a hook');
});

test('a message whose only text is content.content converts with it as a text part', () => {
  const wire = convert.messageToProto({ id: 'm', role: 'user', content: { format: 2, parts: [], content: 'old form' } });
  assert.deepStrictEqual(convert.messageFromProto(wire).content.parts, [{ type: 'text', text: 'old form' }]);
});
