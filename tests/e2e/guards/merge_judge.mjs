// A processor of its own (not a built-in guard) whose typed verdict may be merged: processInput
// asks the model gateway with a `section`, so the gateway may judge it in one call with the
// guards of another sidecar that judge the same text with the same model. Option `delay_ms`:
// it asks that long after the hook is called (a sidecar that wakes late, test_merge_late_question.py).
//   node tests/e2e/guards/merge_judge.mjs --listen unix:///tmp/merge-judge.sock
import sdk from '../../../sdk/node/index.js';

const { Processor, run } = sdk;

const VERDICT = {
  type: 'object',
  properties: { allowed: { type: 'boolean' } },
  required: ['allowed'],
  additionalProperties: false,
};
const INSTRUCTIONS = 'You review requests for the house policy. Answer {"allowed": true|false}.';
const QUESTION = 'Is this request allowed by the house policy?';

class PolicyJudge extends Processor {
  id = 'policy';

  async processInput({ messages, model, abort, options }) {
    if (options.delay_ms) await new Promise((resolve) => setTimeout(resolve, options.delay_ms));
    const text = messages.flatMap((m) => m.content.parts).filter((p) => p.type === 'text').map((p) => p.text).join(' ');
    const verdict = await model(options.model).generate(
      [
        { role: 'system', content: INSTRUCTIONS },
        { role: 'user', content: `${QUESTION}\n${text}` },
      ],
      { schema: VERDICT, temperature: 0, section: { content: text, instructions: INSTRUCTIONS, question: QUESTION } },
    );
    if (!verdict.object.allowed) abort('policy: not allowed');
    return messages;
  }
}

await run([new PolicyJudge()]);
