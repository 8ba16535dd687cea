// Node twins of the processors in fusion_twins.py: the same behaviour written with @procmesh/sdk,
// so fused requests and rewinds can be sent to both SDKs and their answers compared.
//   node tests/e2e/node/fusion_twins.mjs --listen ADDR     (FUSION_SET=leaky: only `leaky`)
import { Processor, run } from '../../../sdk/node/index.js';

const textOf = (messages) => messages.flatMap((m) => m.content.parts.filter((p) => p.type === 'text').map((p) => p.text ?? '')).join(' ');

/** Counts what it sees in its state; numbers streamed text; emits a custom chunk on `emit`. */
class Tally extends Processor {
  id = 'tally';
  speculative = true;
  processDataParts = true;
  async processInput({ messages, state, writer }) {
    state.calls = (state.calls ?? 0) + 1;
    if (textOf(messages).includes('emit')) await writer.custom({ type: 'data-tally', data: { calls: state.calls } });
  }
  async processOutputStream({ part, state, streamParts, writer }) {
    state.n = (state.n ?? 0) + 1;
    if (part.type.startsWith('data-')) return { ...part, data: { seen: part.data ?? null, n: state.n } };
    const text = part.payload.text ?? '';
    if (text.includes('emit')) await writer.custom({ type: 'data-tally', data: { n: state.n } });
    return { ...part, payload: { ...part.payload, text: `${text}#${state.n}/${streamParts.length}` } };
  }
}

/** Rewrites, signals, aborts, fails or splits, by the words of its input. */
class Shout extends Processor {
  id = 'shout';
  speculative = true;
  async processInput({ messages, state, sendSignal, abort }) {
    const text = textOf(messages);
    state.seen = (state.seen ?? 0) + 1;
    if (text.includes('stop')) abort('shout stops here', { metadata: { at: 'input' } });
    if (text.includes('boom')) throw new Error('shout exploded');
    if (text.includes('signal')) await sendSignal({ type: 'reactive', contents: 'heard you', attributes: { k: 'v' } });
    if (text.includes('rewrite')) return messages.map((m) => ({ ...m, content: { ...m.content, parts: [{ type: 'text', text: 'REWRITTEN' }] } }));
    return undefined;
  }
  async processOutputStream({ part, state, sendSignal, abort }) {
    state.n = (state.n ?? 0) + 1;
    const text = part.payload.text ?? '';
    if (text.includes('stop')) abort('shout stops the stream');
    if (text.includes('boom')) throw new Error('shout exploded');
    if (text.includes('drop')) return undefined;
    if (text.includes('sig')) await sendSignal({ type: 'notification', contents: `saw ${text}` });
    if (text.includes('split')) return text.split(' ').filter(Boolean).map((w) => ({ ...part, payload: { ...part.payload, text: w } }));
    return { ...part, payload: { ...part.payload, text: text.toUpperCase() } };
  }
}

/** Not speculative: passes everything on and counts. */
class Plain extends Processor {
  id = 'plain';
  async processInput({ state }) {
    state.calls = (state.calls ?? 0) + 1;
  }
  async processOutputStream({ part, state }) {
    state.n = (state.n ?? 0) + 1;
    return part;
  }
}

/** Declares speculative but counts in a field, not in `state`: a rewind cannot undo it. */
class Leaky extends Processor {
  id = 'leaky';
  speculative = true;
  count = 0;
  async processOutputStream({ part, state }) {
    this.count += 1;
    state.n = this.count;
    return { ...part, payload: { ...part.payload, text: `${part.payload.text ?? ''}#${this.count}` } };
  }
}

await run(process.env.FUSION_SET === 'leaky' ? [new Leaky()] : [new Tally(), new Shout(), new Plain()]);
