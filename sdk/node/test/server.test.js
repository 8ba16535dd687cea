'use strict';
// A real server on TCP port 0, called with a @grpc/grpc-js client built from the same contract.
const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');

const { ProcessorServer, loadContract } = require('..');

test('a TCP server resolves port 0, answers Describe and hooks, and stops', async () => {
  const processor = {
    id: 'upper',
    async processOutputStep({ text, state }) {
      state.seen = text.toUpperCase();
      return [];
    },
  };
  const server = await new ProcessorServer([processor], { address: '127.0.0.1:0', logLevel: 'ERROR' }).start();
  const [address] = server.addresses;
  assert.match(address, /^127\.0\.0\.1:[1-9]\d*$/);
  const { ProcessorService } = loadContract();
  const client = new ProcessorService(address, grpc.credentials.createInsecure());
  const call = (method, request) =>
    new Promise((resolve, reject) => client[method](request, (err, resp) => (err ? reject(err) : resolve(resp))));
  const described = await call('Describe', {});
  assert.deepEqual(described.processors.map((p) => [p.id, p.hooks]), [['upper', ['HOOK_PROCESS_OUTPUT_STEP']]]);
  const resp = await call('ProcessOutputStep', { context: { processor_id: 'upper' }, text: 'hi' });
  assert.equal(resp.effects.state.fields.seen.stringValue, 'HI');
  await assert.rejects(call('ProcessInput', { context: { processor_id: 'upper' } }), (err) => err.code === grpc.status.UNIMPLEMENTED);
  client.close();
  await server.stop(1);
});

test('a processor without id or hooks is refused when the server is built', () => {
  assert.throws(() => new ProcessorServer([{ processInput() {} }]), /has no id/);
  assert.throws(() => new ProcessorServer([{ id: 'x' }]), /implements no hook/);
  assert.throws(() => new ProcessorServer([{ id: 'x', processInput() {} }, { id: 'x', processInput() {} }]), /share the id/);
  assert.throws(() => new ProcessorServer([]), /at least one processor/);
});

test('processOutputStream may turn one part into several (an array), in order after the first', async () => {
  const processor = {
    id: 'split',
    async processOutputStream({ part }) {
      if (part.type !== 'text-delta') return part;
      return part.payload.text.split('').map((ch) => ({ type: 'text-delta', payload: { text: ch } }));
    },
  };
  const server = await new ProcessorServer([processor], { address: '127.0.0.1:0', logLevel: 'ERROR' }).start();
  const { ProcessorService } = loadContract();
  const client = new ProcessorService(server.addresses[0], grpc.credentials.createInsecure());
  const stream = client.ProcessOutputStream();
  const results = [];
  const done = new Promise((resolve, reject) => {
    stream.on('data', (msg) => results.push(...msg.results));
    stream.on('end', resolve);
    stream.on('error', reject);
  });
  stream.write({
    context: { processor_id: 'split' },
    parts: [{ seq: 1, part: { type: 'text-delta', text_delta: { text: 'abc' } } }],
  });
  stream.end();
  await done;
  assert.equal(results.length, 1);
  assert.equal(results[0].part.text_delta.text, 'a');
  assert.deepEqual(results[0].extra_parts.map((p) => p.text_delta.text), ['b', 'c']);
  client.close();
  await server.stop(1);
});

test('executeTool runs a tool the processor added and returns its result', async () => {
  const processor = {
    id: 'tools',
    async executeTool({ toolName, args, state }) {
      state.calls = (state.calls || 0) + 1;
      return { tool: toolName, echo: args };
    },
  };
  const server = await new ProcessorServer([processor], { address: '127.0.0.1:0', logLevel: 'ERROR' }).start();
  const { ProcessorService } = loadContract();
  const client = new ProcessorService(server.addresses[0], grpc.credentials.createInsecure());
  const call = (method, request) =>
    new Promise((resolve, reject) => client[method](request, (err, resp) => (err ? reject(err) : resolve(resp))));
  const described = await call('Describe', {});
  assert.deepEqual(described.processors[0].hooks, ['HOOK_EXECUTE_TOOL']);
  const resp = await call('ExecuteTool', {
    context: { processor_id: 'tools' },
    tool_name: 'search_tools',
    args: { structValue: { fields: { query: { stringValue: 'weather' } } } },
  });
  assert.equal(resp.result.structValue.fields.tool.stringValue, 'search_tools');
  assert.equal(resp.result.structValue.fields.echo.structValue.fields.query.stringValue, 'weather');
  assert.equal(resp.effects.state.fields.calls.numberValue, 1);
  client.close();
  await server.stop(1);
});

test('hosted tools: Describe lists them, an empty processor_id runs one, a throw is its error', async () => {
  const weather = {
    name: 'weather',
    description: 'Current weather for a city.',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } } },
    async execute(args, ctx) {
      if (args.city === 'nowhere') throw new Error(`no weather for ${args.city}`);
      return { city: args.city, runId: ctx.runId, toolCallId: ctx.toolCallId, ids: ctx.messages.map((m) => m.id), signal: ctx.abortSignal instanceof AbortSignal };
    },
  };
  const server = await new ProcessorServer([], { address: '127.0.0.1:0', logLevel: 'ERROR', tools: [weather] }).start();
  const { ProcessorService } = loadContract();
  const client = new ProcessorService(server.addresses[0], grpc.credentials.createInsecure());
  const call = (method, request) =>
    new Promise((resolve, reject) => client[method](request, (err, resp) => (err ? reject(err) : resolve(resp))));
  const described = await call('Describe', {});
  assert.deepEqual(described.processors, []);
  assert.deepEqual(described.tools.map((t) => [t.name, t.description]), [['weather', 'Current weather for a city.']]);
  const args = (city) => ({ structValue: { fields: { city: { stringValue: city } } } });
  const ok = await call('ExecuteTool', { context: { run_id: 'r1' }, tool_name: 'weather', tool_call_id: 'c1', args: args('Paris') });
  const fields = ok.result.structValue.fields;
  assert.deepEqual([fields.city.stringValue, fields.runId.stringValue, fields.toolCallId.stringValue, fields.signal.boolValue], ['Paris', 'r1', 'c1', true]);
  assert.ok(!ok.error);
  const failed = await call('ExecuteTool', { context: {}, tool_name: 'weather', args: args('nowhere') });
  assert.equal(failed.error, 'no weather for nowhere');
  assert.ok(!failed.result);
  await assert.rejects(call('ExecuteTool', { context: {}, tool_name: 'ghost' }), (err) => err.code === grpc.status.NOT_FOUND);
  client.close();
  await server.stop(1);
});

test('bad tools are refused when the server is built', () => {
  const execute = async () => null;
  assert.throws(() => new ProcessorServer([], { tools: [{ execute }] }), /a tool has no name/);
  assert.throws(() => new ProcessorServer([], { tools: [{ name: 't', execute }, { name: 't', execute }] }), /two tools share the name 't'/);
  assert.throws(() => new ProcessorServer([], { tools: [{ name: 't', inputSchema: { type: 'array' }, execute }] }), /inputSchema must be a JSON schema object/);
  assert.throws(() => new ProcessorServer([], { tools: [{ name: 't' }] }), /has no execute\(\) function/);
  assert.throws(() => new ProcessorServer([], { tools: [{ name: 'a b', execute }] }), /must be 1-64 letters/);
});

test('an output stream counts as one hook call; its parts are counted apart', async () => {
  const processor = {
    id: 'stopper',
    async processOutputStream({ part, abort }) {
      if (part.type === 'text-delta' && part.payload.text === 'stop') abort('stopped');
      return part;
    },
  };
  const server = await new ProcessorServer([processor], { address: '127.0.0.1:0', logLevel: 'ERROR' }).start();
  const { ProcessorService } = loadContract();
  const client = new ProcessorService(server.addresses[0], grpc.credentials.createInsecure());
  const stream = async (texts) => {
    const call = client.ProcessOutputStream();
    const done = new Promise((resolve, reject) => {
      call.on('data', () => {});
      call.on('end', resolve);
      call.on('error', reject);
    });
    const parts = texts.map((text, i) => ({ seq: i + 1, part: { type: 'text-delta', text_delta: { text } } }));
    call.write({ context: { processor_id: 'stopper' }, parts });
    call.end();
    await done;
  };
  await stream(['a', 'b']);
  await stream(['c', 'stop']);
  const values = async (name) => {
    const metric = await server.metrics.registry.getSingleMetric(name).get();
    return Object.fromEntries(metric.values.map((v) => [`${v.labels.hook || ''}/${v.labels.outcome}`, v.value]));
  };
  assert.deepEqual(await values('procmesh_sidecar_hook_calls_total'), {
    'process_output_stream/ok': 1,
    'process_output_stream/abort': 1,
  });
  assert.deepEqual(await values('procmesh_sidecar_stream_parts_total'), { '/ok': 3, '/abort': 1 });
  client.close();
  await server.stop(1);
});
