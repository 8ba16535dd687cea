// Node twins of the Python processors in parity_twins.py: the same behaviour written with
// @procmesh/sdk, so the two SDKs can be sent identical requests and their answers compared.
//   node tests/e2e/node/contract.mjs --listen ADDR     (SETUP_DELAY_MS: a slow setup())
import { Processor, TripWire, run } from '../../../sdk/node/index.js';

const SKIP = new Set(['abort', 'release', 'sendSignal', 'writer', 'reportViolation', 'messageList', 'state', 'abortSignal', 'model']);

/** JSON-safe copy: bytes become {base64}, undefined becomes null (Python's None). */
function plain(value) {
  if (value === undefined || value === null) return null;
  if (value instanceof Uint8Array) return { base64: Buffer.from(value).toString('base64') };
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  return value;
}

function record(hook, args) {
  const seen = {};
  for (const [key, value] of Object.entries(args)) {
    if (SKIP.has(key)) continue;
    if (key === 'streamParts') seen.streamParts = value.length;
    else if (key === 'requestContext') seen.requestContext = value.toJSON();
    else seen[key] = plain(value);
  }
  if (args.messageList) seen.messageList = args.messageList.getAll().map((m) => m.id);
  args.state.seen ??= {};
  if (hook === 'processOutputStream') (args.state.seen[hook] ??= []).push(seen);
  else args.state.seen[hook] = seen;
}

/** Records what every hook is handed; returns it unchanged where a hook can return something. */
class Echo extends Processor {
  id = 'echo';
  processDataParts = true;
  async processInput(args) {
    record('processInput', args);
    return args.messages;
  }
  async processInputStep(args) {
    record('processInputStep', args);
    const { messages, systemMessages, model, tools, toolChoice, activeTools, providerOptions, modelSettings } = args;
    return { messages, systemMessages, model, tools, toolChoice, activeTools, providerOptions, modelSettings };
  }
  async processLLMRequest(args) {
    record('processLLMRequest', args);
    return { prompt: args.prompt };
  }
  async processLLMResponse(args) {
    record('processLLMResponse', args);
  }
  async processOutputStream(args) {
    record('processOutputStream', args);
    return args.part;
  }
  async processOutputStep(args) {
    record('processOutputStep', args);
    return args.messages;
  }
  async processToolResult(args) {
    record('processToolResult', args);
    return args.result;
  }
  async processOutputResult(args) {
    record('processOutputResult', args);
    return args.messages;
  }
  async processAPIError(args) {
    record('processAPIError', args);
    return { retry: false };
  }
}

const textMessage = (id, role, text) => ({ id, role, content: { format: 2, parts: [{ type: 'text', text }] } });

/** Signals, custom chunks, violations, aborts and message-list edits. */
class Effects extends Processor {
  id = 'effects';
  async processInput({ messageList, state }) {
    messageList.add(textMessage('added', 'user', 'from the message list'));
    state.calls = (state.calls ?? 0) + 1;
  }
  async processInputStep({ messageList, messages }) {
    messageList.removeByIds([messages[0].id]);
    messageList.add(textMessage('n1', 'user', 'new'));
  }
  async processLLMResponse({ chunks, sendSignal, writer, reportViolation, state }) {
    const text = chunks.filter((c) => c.type === 'text-delta').map((c) => c.payload.text).join('');
    await sendSignal({ type: 'reactive', contents: `You wrote ${text.length} characters.`, tagName: 'length-note', attributes: { zeta: 1, alpha: 'a', mid: [1, 2] } });
    await sendSignal({ type: 'state', contents: 'a state signal', metadata: { k: 'v' }, id: 'sig-1' });
    await writer.custom({ type: 'data-length', data: { chars: text.length }, transient: true });
    reportViolation('long answer', { chars: text.length });
    reportViolation('no detail');
    state.history = [...(state.history ?? []), text.length];
  }
  async processOutputStep({ text, abort }) {
    if (text.includes('forbidden')) abort('forbidden word in output', { retry: true, metadata: { word: 'forbidden', score: 0.9 } });
    if (text.includes('default')) abort();
    if (text.includes('thrown')) throw new TripWire('thrown tripwire', { metadata: ['a', 1] });
    return [];
  }
  async processOutputResult({ messages, result }) {
    const meta = { chars: result.text.length, finishReason: result.finishReason, usage: result.usage };
    return messages.map((m) => ({ ...m, content: { ...m.content, metadata: meta } }));
  }
  async processAPIError({ error, messageList, retryCount }) {
    if (error.status === 400 && retryCount === 0) {
      messageList.removeByIds([messageList.getAll()[0].id]);
      return { retry: true };
    }
  }
  async processToolResult({ toolName, result }) {
    if (toolName === 'secrets') return { redacted: true, keys: Object.keys(result).sort() };
  }
  async processLLMRequest({ prompt }) {
    return {
      prompt: [{ role: 'system', content: 'Be brief.' }, ...prompt],
      response: [
        { type: 'text-delta', payload: { id: 't1', text: 'from cache' } },
        { type: 'finish', payload: { finishReason: 'stop', usage: { inputTokens: 0, outputTokens: 2, totalTokens: 2 } } },
      ],
    };
  }
}

/** processOutputStream: keep, replace (up:), drop, abort (stop), emit, raise (boom), bad return. */
class Censor extends Processor {
  id = 'censor';
  async processOutputStream({ part, streamParts, abort, writer, state }) {
    state.calls = (state.calls ?? 0) + 1;
    if (part.type.startsWith('data-')) return { type: part.type, data: { seen_by: this.id } };
    const text = part.payload.text ?? '';
    if (text === 'drop') return null;
    if (text === 'stop') abort('stop word', { metadata: { at: streamParts.length } });
    if (text === 'emit') await writer.custom({ type: 'data-note', data: { parts_so_far: streamParts.length } });
    if (text === 'boom') throw new Error('stream exploded');
    if (text === 'bad') return 'not a chunk';
    if (text.startsWith('up:')) return { ...part, payload: { ...part.payload, text: text.slice(3).toUpperCase() } };
    return part;
  }
}

class DataCensor extends Censor {
  id = 'data-censor';
  processDataParts = true;
}

/** Hooks that throw, return what the contract does not allow, or misuse the SDK. */
class Faulty extends Processor {
  id = 'faulty';
  async processInput() {
    throw new Error('boom');
  }
  async processInputStep() {
    return 42;
  }
  async processOutputStep() {
    return 'not a list';
  }
  async processOutputResult({ state }) {
    state.tags = 1n; // a BigInt has no JSON form
  }
  async processToolResult({ sendSignal }) {
    await sendSignal({ type: 'bogus', contents: 'x' });
  }
  async processLLMRequest({ writer }) {
    await writer.custom({ type: 'oops', data: 1 });
  }
  async processLLMResponse() {
    return { ignored: true };
  }
  async processAPIError() {
    return 'yes';
  }
}

/** Options validated against a schema (the Python twin uses a pydantic model). */
class Strict extends Processor {
  id = 'strict';
  optionsSchema = {
    type: 'object',
    additionalProperties: false,
    properties: {
      mode: { type: 'string', enum: ['a', 'b'], default: 'a' },
      limit: { type: 'integer', default: 3 },
    },
  };
  async processInput({ options, state }) {
    state.options = options;
  }
}

/** Ready only after a slow setup(): hooks answer UNAVAILABLE and health NOT_SERVING until then. */
class Slow extends Processor {
  id = 'slow';
  async setup() {
    await new Promise((resolve) => setTimeout(resolve, Number(process.env.SETUP_DELAY_MS || 0)));
  }
  async processInput() {}
}

await run([new Echo(), new Effects(), new Censor(), new DataCensor(), new Faulty(), new Strict(), new Slow()]);
