'use strict';
// A message part of a kind this SDK does not know (a newer orchestrator's) passes through untouched:
// decoded with its bytes kept, shown as procmesh-unknown, written back byte for byte.

const test = require('node:test');
const assert = require('node:assert/strict');

const convert = require('../lib/convert');
const { loadContract } = require('../lib/contract');
const { rawService } = require('../lib/guard');

const { service, decoders } = rawService(loadContract().ProcessorService.service);
const plain = loadContract().ProcessorService.service.ProcessInput;

/** A ProcessInputRequest whose message holds a text part, then a part of kind field 15 (unknown
 * to this release): the second text part's tag (field 1) turned into field 15's, same length. */
function withNewKind() {
  const buf = plain.requestSerialize({
    messages: [{ id: 'm', role: 'user', content: { format: 2, parts: [{ text: { text: 'hi' } }, { text: { text: 'XX' } }] } }],
  });
  const at = buf.indexOf(Buffer.from([0x0a, 0x04, 0x0a, 0x02, 0x58, 0x58]));
  assert.ok(at > 0);
  const out = Buffer.from(buf);
  out[at] = 0x7a;
  return { buf: out, part: out.subarray(at, at + 6) };
}

test('a part of an unknown kind is shown as procmesh-unknown and written back as it came', () => {
  const { buf, part } = withNewKind();
  const [msg] = decoders.ProcessInput(buf).messages.map(convert.messageFromProto);
  assert.deepEqual(msg.content.parts, [
    { type: 'text', text: 'hi' },
    { type: 'procmesh-unknown', proto: Buffer.from(part).toString('base64') },
  ]);
  const out = service.ProcessInput.responseSerialize({ replace_messages: true, messages: [convert.messageToProto(msg)] });
  assert.ok(out.includes(Buffer.concat([Buffer.from([0x12, part.length]), part])), out.toString('hex'));
});

test('requests without such a part take the usual path', () => {
  const usual = decoders.ProcessInput(plain.requestSerialize({ messages: [{ id: 'x', role: 'user', content: { format: 2, parts: [{ text: { text: 'a' } }] } }] }));
  assert.deepEqual(convert.messageFromProto(usual.messages[0]).content.parts, [{ type: 'text', text: 'a' }]);
  assert.throws(() => convert.messageFromProto({ id: 'x', role: 'user', content: { parts: [{}] } }), /no kind set/);
});
