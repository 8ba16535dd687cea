// A Node sidecar whose processOutputStream holds every text delta and, at the step's end, lets
// each go with `release` once its gate opens: for test_node_release.py.
//   node tests/e2e/node/release.mjs --listen ADDR   (GATE_DIR: a delta "x" waits for the file
//   `open-x` there)
import fs from 'node:fs';
import path from 'node:path';
import { Processor, run } from '../../../sdk/node/index.js';

const dir = process.env.GATE_DIR;

class Holder extends Processor {
  id = 'holder';
  async processOutputStream({ part, state, release, reportViolation }) {
    if (part.type === 'text-delta') {
      (state.held = state.held || []).push(part);
      return null;
    }
    for (const held of state.held || []) {
      const text = held.payload.text;
      while (!fs.existsSync(path.join(dir, `open-${text}`))) await new Promise((resolve) => setTimeout(resolve, 5));
      reportViolation(`judged ${text}`);
      release(held);
    }
    delete state.held;
    return part;
  }
}

class Passer extends Processor {
  id = 'passer';
  async processOutputStream({ part }) {
    return part;
  }
}

await run([new Holder(), new Passer()]);
