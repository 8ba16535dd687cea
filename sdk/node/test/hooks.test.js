'use strict';
// The hook table against the loaded contract, and everything derived from it against the table:
// a hook added to the proto, the table or a codec alone fails here.
const test = require('node:test');
const assert = require('node:assert/strict');

const sdk = require('..');
const { CODECS } = require('../lib/codecs');
const { BASE_ARGUMENTS, BY_ENUM, BY_NAME, BY_RPC, HOOKS, HOOK_NAMES } = require('../lib/hooks');
const { HookEffects } = require('../lib/processor');
const { Hosted, Servicer } = require('../lib/servicer');

test('the table lists the proto Hook enum in order, each with its RPC, messages and streaming flag', () => {
  const contract = sdk.loadContract();
  const values = contract.Hook.type.value.filter((v) => v.number !== 0);
  assert.deepEqual(HOOKS.map((h) => [h.enumName, h.enum]), values.map((v) => [v.name, v.number]));
  const methods = contract.ProcessorService.service;
  assert.deepEqual(Object.keys(methods).filter((rpc) => rpc !== 'Describe').sort(), HOOKS.map((h) => h.rpc).sort());
  for (const hook of HOOKS) {
    const method = methods[hook.rpc];
    assert.equal(method.requestType.type.name, hook.request, hook.name);
    assert.equal(method.responseType.type.name, hook.response, hook.name);
    assert.equal(method.requestStream, hook.streaming, hook.name);
    assert.equal(method.responseStream, hook.streaming, hook.name);
  }
  assert.deepEqual(HOOK_NAMES, HOOKS.map((h) => h.name));
  assert.deepEqual(sdk.HOOK_NAMES, HOOK_NAMES);
  for (const hook of HOOKS) {
    assert.equal(BY_NAME[hook.name], hook);
    assert.equal(BY_RPC[hook.rpc], hook);
    assert.equal(BY_ENUM[hook.enum], hook);
  }
});

test('the base arguments and each codec hand a hook exactly the arguments the table lists', () => {
  const hosted = new Hosted({ id: 'p', processInput() {} });
  const base = new Servicer(new Map([['p', hosted]]), null).baseArgs(hosted, {}, new HookEffects('p'), new AbortController().signal);
  assert.deepEqual(Object.keys(base), [...BASE_ARGUMENTS]);
  for (const hook of HOOKS) {
    // The output stream adds these three itself (./stream); every other hook through its codec.
    const own = hook.streaming ? ['part', 'streamParts', 'release'] : Object.keys(CODECS[hook.name].decode({}).args);
    assert.deepEqual([...BASE_ARGUMENTS, ...own].sort(), [...hook.arguments].sort(), hook.name);
  }
  assert.deepEqual(Object.keys(CODECS).sort(), HOOKS.filter((h) => !h.streaming).map((h) => h.name).sort());
});

test('Describe lists the hooks a processor implements in the enum order, by enum name', () => {
  const hosted = new Hosted({ id: 'p', executeTool() {}, processInput() {}, processOutputStream() {} });
  assert.deepEqual(hosted.info().hooks, ['HOOK_PROCESS_INPUT', 'HOOK_PROCESS_OUTPUT_STREAM', 'HOOK_EXECUTE_TOOL']);
});

test('every export is also a named export for ES modules (`import { run } from "@procmesh/sdk"`)', async () => {
  const esm = await import('@procmesh/sdk');
  assert.deepEqual(Object.keys(esm).filter((k) => k !== 'default').sort(), Object.keys(sdk).sort());
});
