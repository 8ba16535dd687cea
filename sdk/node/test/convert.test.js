'use strict';
// Unit tests of the pure parts: wire conversion, options validation, settings, the message list.
// `npm test` (node --test); tests/e2e/node/test_node_unit.py runs them in CI.
const test = require('node:test');
const assert = require('node:assert/strict');

const { convert, MessageList, TripWire, settingsFromArgs, errors, loadContract } = require('..');
const { validate } = require('../lib/options');
const { HookEffects, Writer } = require('../lib/processor');

test('JSON values round-trip through google.protobuf.Value', () => {
  const value = { a: 1, b: 2.5, c: null, d: [true, 'x', {}, []], e: { f: { g: -3 } } };
  assert.deepEqual(convert.fromValue(convert.toValue(value)), value);
  assert.deepEqual(convert.fromStruct(convert.toStruct(value)), value);
});

test('undefined object members are left out, as JSON.stringify does', () => {
  assert.deepEqual(convert.fromStruct(convert.toStruct({ a: undefined, b: 1 })), { b: 1 });
  assert.deepEqual(convert.fromValue(convert.toValue([undefined])), [null]);
});

test('values with no JSON form are a TypeError', () => {
  assert.throws(() => convert.toValue(1n), TypeError);
  assert.throws(() => convert.toValue(() => 1), TypeError);
  assert.throws(() => convert.toValue(new Uint8Array([1])), TypeError);
  assert.throws(() => convert.toStruct([1]), TypeError);
});

test('objects with toJSON (Date) are converted through it', () => {
  const when = new Date('2025-01-02T03:04:05Z');
  assert.deepEqual(convert.fromValue(convert.toValue({ when })), { when: '2025-01-02T03:04:05.000Z' });
});

test('the wire encoding survives serialization by the loaded contract', () => {
  const { ProcessorService } = loadContract();
  const method = ProcessorService.service.ProcessInput;
  const msg = {
    id: 'm1',
    role: 'user',
    content: {
      format: 2,
      parts: [
        { type: 'text', text: 'hi' },
        { type: 'file', mediaType: 'image/png', data: Buffer.from([1, 2]) },
        { type: 'data-x', data: { n: 1 } },
        { type: 'step-start' },
      ],
      metadata: { k: [1, { z: null }] },
    },
  };
  const wire = method.requestDeserialize(method.requestSerialize({ messages: [convert.messageToProto(msg)] }));
  assert.deepEqual(convert.messageFromProto(wire.messages[0]), msg);
});

test('provenance crosses the contract in prompts and messages, as the Python SDK carries it', () => {
  const { ProcessorService } = loadContract();
  const method = ProcessorService.service.ProcessLLMRequest;
  const prompt = [
    { role: 'user', content: [{ type: 'file', mediaType: 'text/plain', data: 'https://x/a', filename: 'a.txt' }] },
    {
      role: 'assistant',
      content: [
        { type: 'reasoning', text: 'r', provider: 'anthropic', signature: 'sig' },
        { type: 'tool-call', toolCallId: 's1', toolName: 'web_search', input: {}, provider: 'openai', providerExecuted: true },
      ],
    },
  ];
  const wire = method.requestDeserialize(method.requestSerialize({ prompt: convert.promptToProto(prompt), model_spec_version: 'v3' }));
  assert.deepEqual(convert.promptFromProto(wire.prompt), prompt);
  assert.equal(wire.model_spec_version, 'v3');
  const stored = {
    id: 'm1',
    role: 'assistant',
    content: {
      format: 2,
      parts: [
        { type: 'reasoning', text: 'r', providerMetadata: { anthropic: { signature: 'sig' } } },
        { type: 'tool-invocation', providerExecuted: true, providerMetadata: { openai: {} }, toolInvocation: { state: 'call', toolCallId: 's1', toolName: 'web_search', args: {} } },
      ],
    },
  };
  assert.deepEqual(convert.messageFromProto(convert.messageToProto(stored)).content.parts, [
    { type: 'reasoning', text: 'r', provider: 'anthropic', signature: 'sig' },
    { type: 'tool-invocation', toolInvocation: { state: 'call', toolCallId: 's1', toolName: 'web_search', args: {} }, provider: 'openai', providerExecuted: true },
  ]);
});

test('a part without kind is an InvalidInputError', () => {
  assert.throws(() => convert.messageFromProto({ id: 'x', role: 'user', content: { parts: [{}] } }), errors.InvalidInputError);
});

test('chunks keep the Python SDK shapes', () => {
  const chunks = [
    { type: 'text-delta', payload: { text: 'a', id: 't' } },
    { type: 'data-x', data: { n: 1 }, transient: true },
    { type: 'tool-call', payload: { toolCallId: 'c', toolName: 'w', args: { a: 1 } } },
    { type: 'tool-call', payload: { toolCallId: 'c', toolName: 'w', args: {}, requestContext: { tier: 'gold' } } },
    { type: 'finish', payload: { finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 2, totalTokens: 3 } } },
    { type: 'start', payload: { anything: ['goes'] } },
  ];
  for (const chunk of chunks) assert.deepEqual(convert.chunkFromProto(convert.chunkToProto(chunk)), chunk);
});

test('options are validated against the schema subset, with defaults', () => {
  const schema = {
    type: 'object',
    additionalProperties: false,
    required: ['name'],
    properties: {
      name: { type: 'string', minLength: 1 },
      n: { type: 'integer', minimum: 0, default: 2 },
      mode: { enum: ['a', 'b'], default: 'a' },
      tags: { type: 'array', items: { type: 'string' }, default: [] },
    },
  };
  assert.deepEqual(validate(schema, { name: 'x' }), { name: 'x', n: 2, mode: 'a', tags: [] });
  assert.throws(() => validate(schema, {}), /'name' is required/);
  assert.throws(() => validate(schema, { name: 'x', extra: 1 }), /unknown keys \["extra"\]/);
  assert.throws(() => validate(schema, { name: 'x', n: 1.5 }), /options.n: expected integer/);
  assert.throws(() => validate(schema, { name: 'x', mode: 'c' }), /must be one of/);
  assert.throws(() => validate(schema, { name: 'x', tags: [1] }), /options.tags\[0\]: expected string/);
});

test('settings come from the environment, and flags win', () => {
  const env = { PROCMESH_LISTEN: '["unix:///a.sock", "127.0.0.1:1"]', PROCMESH_GRACE_SECONDS: '3' };
  assert.deepEqual(settingsFromArgs([], env).addresses, ['unix:///a.sock', '127.0.0.1:1']);
  const s = settingsFromArgs(['--listen', 'x:1', '--listen=y:2', '--grace-seconds', '1', '--other', 'z'], env, { extraFlags: ['--other'] });
  assert.deepEqual(s.addresses, ['x:1', 'y:2']);
  assert.equal(s.graceSeconds, 1);
  assert.deepEqual(s.extra, { other: 'z' });
  assert.deepEqual(settingsFromArgs([], {}).addresses, ['127.0.0.1:50051']);
  // Strict: a misspelt flag must not leave the sidecar on its defaults.
  assert.throws(() => settingsFromArgs(['--listne', 'x:1'], {}), /unknown flag --listne/);
  assert.throws(() => settingsFromArgs([], { PROCMESH_LISTEN: 'nope' }), /not host:port/);
  assert.throws(() => settingsFromArgs([], { PROCMESH_LOG_FORMAT: 'xml' }), /log_format/);
  assert.throws(() => settingsFromArgs(['--metrics-port', 'many'], {}), /metrics_port/);
  assert.equal(settingsFromArgs([], { PROCMESH_LISTEN: '127.0.0.1:5' }).addresses[0], '127.0.0.1:5');
  assert.equal(settingsFromArgs(['--version'], {}).action, 'version');
});

test('the message list records edits and reads like the reference engine', () => {
  const list = new MessageList([{ id: 'a' }, { id: 'b' }]);
  assert.equal(list.modified, false);
  assert.deepEqual(list.get.all.db().map((m) => m.id), ['a', 'b']);
  list.removeByIds(['nope']);
  assert.equal(list.modified, false);
  list.add({ id: 'a', v: 2 }).replace({ id: 'b', v: 3 });
  assert.deepEqual(list.getAll(), [{ id: 'b', v: 3 }, { id: 'a', v: 2 }]);
  assert.throws(() => list.replace({ id: 'zz' }), errors.InvalidInputError);
});

test('abort throws a TripWire with the default reason; sendSignal and writer validate', async () => {
  const effects = new HookEffects('p');
  assert.throws(() => effects.abortHook(), (err) => err instanceof TripWire && err.reason === 'Tripwire triggered by p');
  assert.throws(() => effects.abortHook('r', { retry: true, metadata: 1 }), (err) => err.retry && err.metadata === 1);
  await assert.rejects(effects.sendSignal({ contents: 1 }), errors.InvalidInputError);
  await assert.rejects(effects.sendSignal({ type: 'state', contents: 'x', transient: true }), /cannot be transient/);
  await assert.rejects(effects.sendSignal({ contents: 'x', tagName: 'bad tag' }), /invalid tagName/);
  await effects.sendSignal({ contents: 'ok', attributes: { a: 1 } });
  assert.equal(effects.signals.length, 1);
  const writer = new Writer(effects);
  await assert.rejects(writer.custom({ type: 'oops' }), /must start with 'data-'/);
  await writer.custom({ type: 'data-ok', data: 1 });
  assert.equal(effects.customChunks.length, 1);
});
