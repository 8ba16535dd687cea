'use strict';
// `npm pack` / `npm publish`: copy the repository's proto/procmesh into ./proto so the packed
// package carries the contract it was built against; `--remove` deletes the copy afterwards, so
// a checkout never holds a second copy that could drift from proto/.
const fs = require('fs');
const path = require('path');

const target = path.join(__dirname, '..', 'proto');
if (process.argv.includes('--remove')) {
  fs.rmSync(target, { recursive: true, force: true });
} else {
  const source = path.join(__dirname, '..', '..', '..', 'proto', 'procmesh', 'v1');
  fs.rmSync(target, { recursive: true, force: true });
  fs.mkdirSync(path.join(target, 'procmesh', 'v1'), { recursive: true });
  // every file lib/ loads (processor.proto: the server; model.proto: `model(ref)`), and what they import
  for (const name of ['processor.proto', 'model.proto', 'types.proto']) {
    fs.copyFileSync(path.join(source, name), path.join(target, 'procmesh', 'v1', name));
  }
}
