// A Node sidecar whose processInput holds until told: for the drain test in test_node_channels.py.
//   node tests/e2e/node/hold.mjs --listen ADDR   (HOLD_DIR: the call writes `entered` there and
//   returns once `release` exists)
import fs from 'node:fs';
import path from 'node:path';
import { Processor, run } from '../../../sdk/node/index.js';

const dir = process.env.HOLD_DIR;

class Hold extends Processor {
  id = 'hold';
  async processInput({ state }) {
    fs.writeFileSync(path.join(dir, 'entered'), '');
    while (!fs.existsSync(path.join(dir, 'release'))) await new Promise((resolve) => setTimeout(resolve, 10));
    state.served = true;
  }
}

await run([new Hold()]);
