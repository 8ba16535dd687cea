// The Node twin of judge.py: processInput asks the orchestrator's model gateway for a verdict
// (PROCMESH_MODEL_GATEWAY, PROCMESH_MODEL_GATEWAY_KEY) and aborts when the input is not allowed;
// a text holding its `settle` option passes unasked, reported to the gateway as a judge call saved.
// `judge-each` asks about every message at once (one GenerateBatch); `judge-stream` asks about each
// text delta of its output stream.
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

// Asks about every message at once, as the built-in guards do (judge.py's JudgeEach: one
// GenerateBatch); a message holding the `flag` option is asked of the `refuse` model instead, so a
// verdict applied to the wrong message shows; aborts naming the messages not allowed.
class JudgeEach extends Processor {
  id = 'judge-each';

  async processInput({ messages, model, abort, options }) {
    const texts = messages.map((m) => m.content.parts.filter((p) => p.type === 'text').map((p) => p.text).join(' '));
    const verdicts = await Promise.all(texts.map((text) => {
      const ref = options.flag && text.includes(options.flag) ? options.refuse : options.model;
      return model(ref).generate(text, { schema: VERDICT, temperature: 0 });
    }));
    const refused = verdicts.flatMap((v, i) => (v.object.allowed ? [] : [i]));
    if (refused.length) abort(`judge-each: not allowed: [${refused.join(', ')}]`);
    return messages;
  }
}

// Asks the gateway about each text delta of its output stream: the call carries the stream
// session's trace context (its span is not active around the parts).
class JudgeStream extends Processor {
  id = 'judge-stream';

  async processOutputStream({ part, model, options }) {
    if (part.type === 'text-delta') await model(options.model ?? 'judge').generate(part.payload.text);
    return part;
  }
}

await run([new Judge(), new JudgeEach(), new JudgeStream()]);
