// Serve the three examples from one sidecar:
//   node sdk/node/examples/serve.mjs --listen 127.0.0.1:50061      (or unix:///tmp/node.sock)
import { run } from '@procmesh/sdk';

import { ResponseValidator } from './response-validator.mjs';
import { StreamFilter } from './stream-filter.mjs';
import { WordCounter } from './word-counter.mjs';

export function processors() {
  return [new StreamFilter(), new ResponseValidator(), new WordCounter()];
}

await run(processors());
