// Serve a conformance scenario's scripted processors from Node:
//   node sdk/node/scripted/serve.mjs --scenario FILE --listen ADDR
// (`procmesh scenario run --sidecar-runtime node FILE` starts it this way.)
import { readFileSync } from 'node:fs';

import { run } from '@procmesh/sdk';

import { scenarioProcessors } from './scripted.mjs';

const argv = process.argv.slice(2);
const at = argv.indexOf('--scenario');
const file = at >= 0 ? argv[at + 1] : argv.find((a) => a.startsWith('--scenario='))?.slice('--scenario='.length);
if (!file) {
  console.error('usage: node serve.mjs --scenario FILE --listen ADDR');
  process.exit(2);
}
await run(scenarioProcessors(JSON.parse(readFileSync(file, 'utf8'))), { extraFlags: ['--scenario'] });
