// Node twins of the hosted tools in test_sdk_tools.py: the same tools written with @procmesh/sdk,
// so both SDKs can be sent identical ExecuteTool requests and their answers compared.
//   node tests/e2e/node/tools.mjs --listen ADDR
import { run } from '../../../sdk/node/index.js';

const slow = { started: 0, aborted: 0 };

const weather = {
  name: 'weather',
  description: 'Current weather for a city.',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  async execute(args, ctx) {
    return {
      city: args.city,
      tempC: 21,
      runId: ctx.runId,
      agentId: ctx.agentId,
      toolCallId: ctx.toolCallId,
      threadId: ctx.threadId ?? null,
      resourceId: ctx.resourceId ?? null,
      requestContext: ctx.requestContext.toJSON(),
      messageIds: ctx.messages.map((m) => m.id),
    };
  },
};

const broken = {
  name: 'broken',
  async execute(args) {
    if (args.long) throw new Error('x'.repeat(10000));
    throw new Error(`no weather for ${args.city}`);
  },
};

const waiting = {
  name: 'slow',
  description: 'Waits until the call is cancelled.',
  execute(args, ctx) {
    slow.started += 1;
    return new Promise((resolve, reject) => {
      ctx.abortSignal.addEventListener('abort', () => {
        slow.aborted += 1;
        reject(ctx.abortSignal.reason);
      });
    });
  },
};

const slowStatus = {
  name: 'slow-status',
  async execute() {
    return { ...slow };
  },
};

const adder = {
  id: 'adder',
  async executeTool({ toolName, args, state }) {
    state.ran = toolName;
    if (args.fail === 'plain') throw new RangeError('cannot add that');
    return args.a + args.b;
  },
};

await run([adder], { tools: [weather, broken, waiting, slowStatus] });
