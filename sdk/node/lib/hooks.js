'use strict';
// The one hook table of the Node SDK: every hook's name, RPC, enum value, arguments and wire
// messages. The server's per-RPC handlers, the processor's hook list and Describe's hook list
// derive from it. The twin of the Python SDK's procmesh/hooks.py; tests/e2e/node/test_hook_tables.py
// checks that both tables agree with the proto's procmesh.v1.Hook enum. Plain data only, so the
// table prints as JSON (`node -e "console.log(JSON.stringify(require('./lib/hooks')))"`).

/**
 * What every hook receives. `abortSignal` is Node's alone: it fires when the call is cancelled
 * or its deadline passes (Python hooks see the same as asyncio cancellation).
 */
const BASE_ARGUMENTS = Object.freeze([
  'abort',
  'state',
  'options',
  'retryCount',
  'stepNumber',
  'runId',
  'agentId',
  'threadId',
  'resourceId',
  'onFailure',
  'requestContext',
  'sendSignal',
  'writer',
  'reportViolation',
  'abortSignal',
  'model',
]);
const MESSAGES = ['messages', 'messageList', 'systemMessages'];

function hook(name, rpc, enumValue, enumName, extra, { streaming = false } = {}) {
  return Object.freeze({
    name,
    rpc,
    enum: enumValue,
    enumName,
    arguments: Object.freeze([...BASE_ARGUMENTS, ...extra]),
    request: `${rpc}Request`,
    response: `${rpc}Response`,
    streaming,
  });
}

/**
 * Every hook, in the proto enum's order. `name` is the reference engine's (camelCase) method
 * name, `enum` the procmesh.v1.Hook number and `enumName` its name (what Describe lists, as the
 * contract is loaded with enums as strings), `request`/`response` the message names (for the
 * stream: one message of each direction).
 */
const HOOKS = Object.freeze([
  hook('processInput', 'ProcessInput', 1, 'HOOK_PROCESS_INPUT', MESSAGES),
  hook('processInputStep', 'ProcessInputStep', 2, 'HOOK_PROCESS_INPUT_STEP', [
    ...MESSAGES,
    'model',
    'tools',
    'toolChoice',
    'activeTools',
    'providerOptions',
    'modelSettings',
    'steps',
  ]),
  hook('processLLMRequest', 'ProcessLLMRequest', 3, 'HOOK_PROCESS_LLM_REQUEST', ['prompt', 'model', 'modelSpecVersion', 'steps']),
  hook('processLLMResponse', 'ProcessLLMResponse', 4, 'HOOK_PROCESS_LLM_RESPONSE', ['chunks', 'model', 'steps', 'fromCache']),
  hook('processOutputStream', 'ProcessOutputStream', 5, 'HOOK_PROCESS_OUTPUT_STREAM', ['part', 'streamParts', 'release'], { streaming: true }),
  hook('processOutputStep', 'ProcessOutputStep', 6, 'HOOK_PROCESS_OUTPUT_STEP', [
    ...MESSAGES,
    'text',
    'toolCalls',
    'finishReason',
    'usage',
    'steps',
  ]),
  hook('processToolResult', 'ProcessToolResult', 7, 'HOOK_PROCESS_TOOL_RESULT', [
    'messages',
    'toolName',
    'toolCallId',
    'args',
    'result',
    'providerExecuted',
    'steps',
  ]),
  hook('processOutputResult', 'ProcessOutputResult', 8, 'HOOK_PROCESS_OUTPUT_RESULT', ['messages', 'messageList', 'result']),
  hook('processAPIError', 'ProcessAPIError', 9, 'HOOK_PROCESS_API_ERROR', ['error', 'messages', 'messageList', 'steps']),
  hook('executeTool', 'ExecuteTool', 10, 'HOOK_EXECUTE_TOOL', ['toolName', 'toolCallId', 'args', 'messages']),
]);

const index = (key) => Object.freeze(Object.fromEntries(HOOKS.map((h) => [h[key], h])));

/** The hook method names, in the enum's order. */
const HOOK_NAMES = Object.freeze(HOOKS.map((h) => h.name));
/** Hooks by method name. */
const BY_NAME = index('name');
/** Hooks by ProcessorService method name. */
const BY_RPC = index('rpc');
/** Hooks by procmesh.v1.Hook number. */
const BY_ENUM = index('enum');

module.exports = { BASE_ARGUMENTS, BY_ENUM, BY_NAME, BY_RPC, HOOKS, HOOK_NAMES };
