// The Node twin of judge.py: processInput asks the orchestrator's model gateway for a verdict
// (PROCMESH_MODEL_GATEWAY, PROCMESH_MODEL_GATEWAY_KEY) and aborts when the input is not allowed;
// a text holding its `settle` option passes unasked, reported to the gateway as a judge call saved.
//   node tests/e2e/gateway/judge.mjs --listen unix:///tmp/judge-node.sock
import sdk from '../../../sdk/node/index.js';

const { Processor, run } = sdk;

const VERDICT = {
  type: 'object',
  properties: { allowed: { type: 'boolean' } },
  required: ['allowed'],
  additionalProperties: false,
};

class Judge extends Processor {
  id = 'judge';

  async processInput({ messages, model, abort, options }) {
    const text = messages.flatMap((m) => m.content.parts).filter((p) => p.type === 'text').map((p) => p.text).join(' ');
    if (options.settle && text.includes(options.settle)) {
      model(options.model ?? 'judge').reportSaved(); // settled by its own check: a judge call saved
      return messages;
    }
    const verdict = await model(options.model ?? 'judge').generate(
      [
        { role: 'system', content: 'Is this request allowed? Answer {"allowed": true|false}.' },
        { role: 'user', content: text },
      ],
      { schema: VERDICT, temperature: 0 },
    );
    if (!verdict.object.allowed) abort('judge: not allowed', { metadata: { attempts: verdict.attempts, model: verdict.model } });
    return messages;
  }
}

await run([new Judge()]);
