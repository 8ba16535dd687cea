'use strict';
// `model(ref).generate` calls a hook makes at once go in one ModelService.GenerateBatch
// (lib/model_batch.js): each caller gets its own answer or its own error, whatever order the
// gateway answers in; one call alone is a Generate; a gateway without GenerateBatch (an older
// orchestrator) is sent the calls one by one. A real @grpc/grpc-js server plays the gateway on
// 127.0.0.1 and records what it is sent (the Python SDK's tests/integration/test_sdk_gateway_batch.py);
// the real orchestrator's side is tested in tests/e2e/gateway/test_gateway_batch.py.
const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const { LOADER_OPTIONS, protoDir } = require('../lib/contract');
const { Model, ModelError, noteDeadline } = require('../lib/model');

const { ModelService } = grpc.loadPackageDefinition(
  protoLoader.loadSync('procmesh/v1/model.proto', { ...LOADER_OPTIONS, includeDirs: [protoDir()] }),
).procmesh.v1;

const lastText = (request) => request.messages[request.messages.length - 1].text;
const echo = (request) => ({ text: `seen: ${lastText(request)}`, model: request.model });
const MISSING = "model 'missing' is not in the config";

/**
 * A gateway answering every call with the text it was asked about: a batch in reverse order, a
 * model named `missing` with NOT_FOUND, one named `hold` never (until the call is cancelled).
 * `batch: false` is an orchestrator from before GenerateBatch (grpc-js answers UNIMPLEMENTED);
 * `refuse` fails a batch as a whole; `drop` leaves its first item unanswered.
 */
async function serveGateway(t, { batch = true, refuse = false, drop = false } = {}) {
  const seen = { generates: [], batches: [], batchDeadlines: [], keys: [], cancelled: 0 };
  const handlers = {
    Generate(call, callback) {
      seen.generates.push(lastText(call.request));
      seen.keys.push(call.metadata.get('authorization')[0]);
      if (call.request.model === 'missing') callback({ code: grpc.status.NOT_FOUND, details: MISSING });
      else callback(null, echo(call.request));
    },
  };
  if (batch) {
    handlers.GenerateBatch = (call) => {
      if (refuse) {
        call.emit('error', { code: grpc.status.PERMISSION_DENIED, details: 'a tenant key may not call the gateway' });
        return;
      }
      const { items } = call.request;
      seen.batches.push(items.map((i) => [lastText(i.request), i.timeout_seconds]));
      seen.batchDeadlines.push((new Date(call.getDeadline()).getTime() - Date.now()) / 1000);
      seen.keys.push(call.metadata.get('authorization')[0]);
      let held = false;
      for (let index = items.length - 1; index >= (drop ? 1 : 0); index--) {
        const { request } = items[index];
        if (request.model === 'hold') held = true;
        else if (request.model === 'missing') call.write({ index, code: grpc.status.NOT_FOUND, message: MISSING });
        else call.write({ index, response: echo(request) });
      }
      if (held) call.on('cancelled', () => (seen.cancelled += 1));
      else call.end();
    };
  }
  const server = new grpc.Server();
  server.addService(ModelService.service, handlers);
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const saved = { ...process.env };
  process.env.PROCMESH_MODEL_GATEWAY = `127.0.0.1:${port}`;
  process.env.PROCMESH_MODEL_GATEWAY_KEY = 'key-a';
  t.after(() => {
    for (const name of ['PROCMESH_MODEL_GATEWAY', 'PROCMESH_MODEL_GATEWAY_KEY']) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
    server.forceShutdown();
  });
  return seen;
}

const ask = (ref, text, options = {}, signal = undefined, log = undefined) =>
  new Model(ref, 'moderation', 'run-1', signal, log).generate(text, options);
const settled = (promises) => Promise.allSettled(promises);

test('calls made at once go in one batch, each answered its own answer whatever the order', async (t) => {
  const seen = await serveGateway(t);
  const texts = ['m0', 'm1', 'm2', 'm3', 'm4'];
  // each caller first awaits a helper of its own depth: a flush on the microtask queue would
  // leave the deeper ones out, the next loop turn's gathers them all
  const depth = async (text, hops) => {
    for (let i = 0; i < hops; i++) await null;
    return text;
  };
  const answers = await Promise.all(texts.map(async (text, i) => ask('judge', await depth(text, i))));
  assert.deepEqual(answers.map((a) => a.text), texts.map((text) => `seen: ${text}`)); // answered in reverse
  assert.deepEqual(answers[0].model, 'judge');
  assert.deepEqual(seen.generates, []);
  assert.deepEqual(seen.batches.map((b) => b.map(([text]) => text)), [texts]);
});

test('one call of a batch fails alone, with the error Generate gives it', async (t) => {
  const seen = await serveGateway(t);
  const [ok, missing, other] = await settled([ask('judge', 'a'), ask('missing', 'b'), ask('judge', 'c')]);
  assert.equal(seen.batches.length, 1);
  assert.deepEqual([ok.value.text, other.value.text], ['seen: a', 'seen: c']);
  assert.ok(missing.reason instanceof ModelError);
  assert.equal(missing.reason.status, grpc.status.NOT_FOUND);
  assert.equal(missing.reason.message, `model gateway: 'missing' failed with NOT_FOUND: ${MISSING}`);
  const [alone] = await settled([ask('missing', 'd')]); // the same call as a Generate of its own
  assert.deepEqual(seen.generates, ['d']);
  assert.equal(alone.reason.message, missing.reason.message);
  assert.equal(alone.reason.status, missing.reason.status);
});

test('each call keeps its own deadline (the hook\'s too); the batch call has the longest', async (t) => {
  const seen = await serveGateway(t);
  const hook = new AbortController();
  noteDeadline(hook.signal, Date.now() + 4000);
  await Promise.all([ask('judge', 'short', { timeoutMs: 2000 }), ask('judge', 'long', { timeoutMs: 9000 }), ask('judge', 'hook', {}, hook.signal)]);
  const [[[, short], [, long], [, bounded]]] = seen.batches;
  // Ordered, not timed: load only shortens what is left of a deadline, so each is at most its own
  // bound and above the next shorter one (a tolerance around the bound fails a correct SDK under load).
  const batch = seen.batchDeadlines[0];
  assert.ok(short > 0 && short <= 2, `short: ${short}`);
  assert.ok(bounded > 2 && bounded <= 4, `the hook's deadline: ${bounded}`);
  assert.ok(long > 4 && long <= 9, `long: ${long}`);
  assert.ok(batch > 4 && batch <= 9, `batch: ${batch}`); // the longest, not the shortest
});

test('a call alone is a Generate', async (t) => {
  const seen = await serveGateway(t);
  assert.equal((await ask('judge', 'alone')).text, 'seen: alone');
  await ask('judge', 'later'); // not made at once with the first: a call of its own too
  assert.deepEqual(seen.generates, ['alone', 'later']);
  assert.deepEqual(seen.batches, []);
});

test('only calls with the same metadata go together', async (t) => {
  const seen = await serveGateway(t);
  const calls = [ask('judge', 'a1'), ask('judge', 'a2')];
  process.env.PROCMESH_MODEL_GATEWAY_KEY = 'key-b';
  calls.push(ask('judge', 'b1'));
  await Promise.all(calls);
  assert.deepEqual(seen.batches.map((b) => b.map(([text]) => text)), [['a1', 'a2']]);
  assert.deepEqual(seen.generates, ['b1']);
  assert.deepEqual(seen.keys.sort(), ['Bearer key-a', 'Bearer key-b']);
});

test('a caller gone (its hook cancelled) is answered CANCELLED; the others are not', async (t) => {
  const seen = await serveGateway(t);
  const hook = new AbortController();
  const held = ask('hold', 'h', {}, hook.signal);
  const others = Promise.all([ask('judge', 'a'), ask('judge', 'c')]);
  assert.deepEqual((await others).map((a) => a.text), ['seen: a', 'seen: c']);
  hook.abort();
  await assert.rejects(held, (err) => err instanceof ModelError && err.status === grpc.status.CANCELLED
    && err.message === "model gateway: 'hold' failed with CANCELLED: Cancelled on client");
  for (let i = 0; i < 100 && !seen.cancelled; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(seen.cancelled, 1); // no caller left: the batch call was cancelled
});

test('a gateway without GenerateBatch is sent the calls one by one, from then on', async (t) => {
  const seen = await serveGateway(t, { batch: false });
  const lines = [];
  const log = { info: (line) => lines.push(line) };
  const answers = await Promise.all(['m0', 'm1', 'm2'].map((text) => ask('judge', text, {}, undefined, log)));
  assert.deepEqual(answers.map((a) => a.text), ['seen: m0', 'seen: m1', 'seen: m2']);
  assert.deepEqual(seen.generates.slice().sort(), ['m0', 'm1', 'm2']);
  const [, missing] = await settled([ask('judge', 'n0', {}, undefined, log), ask('missing', 'n1', {}, undefined, log)]);
  assert.deepEqual(seen.generates.slice(3).sort(), ['n0', 'n1']); // no second try of the batch
  assert.equal(missing.reason.message, `model gateway: 'missing' failed with NOT_FOUND: ${MISSING}`);
  assert.deepEqual(lines, ['model gateway: no GenerateBatch (an older orchestrator): calls go one by one']);
});

test('a batch refused as a whole fails each caller with its status, as Generate would', async (t) => {
  const refused = await serveGateway(t, { refuse: true });
  const answers = await settled([ask('judge', 'a'), ask('judge', 'b')]);
  assert.deepEqual(answers.map((a) => a.reason && a.reason.message), [
    "model gateway: 'judge' failed with PERMISSION_DENIED: a tenant key may not call the gateway",
    "model gateway: 'judge' failed with PERMISSION_DENIED: a tenant key may not call the gateway",
  ]);
  assert.deepEqual(refused.generates, []); // not sent again: only UNIMPLEMENTED is
});

test('a call the gateway leaves unanswered fails alone', async (t) => {
  const dropping = await serveGateway(t, { drop: true });
  const [first, second] = await settled([ask('judge', 'a'), ask('judge', 'b')]);
  assert.equal(first.reason.status, grpc.status.INTERNAL);
  assert.equal(first.reason.message, "model gateway: 'judge' failed with INTERNAL: the gateway ended the batch without answering this call");
  assert.equal(second.value.text, 'seen: b');
  assert.equal(dropping.batches.length, 1);
});

test('a caller gone before the flush is not sent; the calls left go together', async (t) => {
  const seen = await serveGateway(t);
  const hook = new AbortController();
  const gone = ask('judge', 'gone', {}, hook.signal);
  const left = Promise.all([ask('judge', 'a'), ask('judge', 'b')]);
  hook.abort(); // in the same turn of the loop: before the batch leaves
  await assert.rejects(gone, (err) => err.status === grpc.status.CANCELLED);
  assert.deepEqual((await left).map((a) => a.text), ['seen: a', 'seen: b']);
  assert.deepEqual(seen.batches.map((b) => b.map(([text]) => text)), [['a', 'b']]);
});
