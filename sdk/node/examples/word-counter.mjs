// A stateful word counter (the seeds' WordCounter): `state` persists across the chunks and hooks
// of one run (the orchestrator owns it and sends it with every call). At the end it emits a
// data-word-count chunk and tags the assistant message's metadata.
import { Processor } from '@procmesh/sdk';

export class WordCounter extends Processor {
  id = 'word-counter';
  description = 'Counts streamed words across chunks; emits data-word-count and tags the answer.';

  async processOutputStream({ part, state }) {
    state.wordCount ??= 0;
    if (part.type === 'text-delta') {
      state.wordCount += part.payload.text.split(/\s+/).filter(Boolean).length;
    }
    return part;
  }

  async processOutputResult({ messages, state, writer }) {
    const words = state.wordCount ?? 0;
    await writer?.custom({ type: 'data-word-count', data: { words } });
    return messages.map((msg) =>
      msg.role === 'assistant'
        ? { ...msg, content: { ...msg.content, metadata: { ...msg.content.metadata, wordCount: words } } }
        : msg,
    );
  }
}
