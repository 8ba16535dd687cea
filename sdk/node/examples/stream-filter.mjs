// A stream filter (the seeds' StreamFilter, with options): masks listed words in every streamed
// text delta and drops the deltas that contain a blocked word. Other chunks pass unchanged.
import { Processor } from '@procmesh/sdk';

export class StreamFilter extends Processor {
  id = 'stream-filter';
  description = 'Masks listed words in streamed text; drops deltas holding a blocked word.';
  optionsSchema = {
    type: 'object',
    additionalProperties: false,
    properties: {
      words: { type: 'array', items: { type: 'string' }, default: ['darn'] },
      drop: { type: 'array', items: { type: 'string' }, default: ['secret'] },
    },
  };

  async processOutputStream({ part, options }) {
    if (part.type !== 'text-delta') return part;
    const text = part.payload.text;
    // Drop text-delta chunks that contain a blocked word (returning nothing drops the chunk).
    if (options.drop.some((word) => text.toLowerCase().includes(word.toLowerCase()))) return null;
    let masked = text;
    for (const word of options.words) {
      masked = masked.replace(new RegExp(word.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'gi'), (m) => '*'.repeat(m.length));
    }
    return { ...part, payload: { ...part.payload, text: masked } };
  }
}
