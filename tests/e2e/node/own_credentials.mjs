// A Node sidecar program that passes its own gRPC credentials to run() (plaintext here): for
// test_sidecar_own_credentials.py, where PROCMESH_TLS_* are set too and must be named as ignored.
//   node tests/e2e/node/own_credentials.mjs --listen ADDR
import { createRequire } from 'node:module';
import { Processor, run } from '../../../sdk/node/index.js';

const grpc = createRequire(new URL('../../../sdk/node/package.json', import.meta.url))('@grpc/grpc-js');

class Pass extends Processor {
  id = 'pass';
  async processInput({ messages }) {
    return messages;
  }
}

await run([new Pass()], { credentials: grpc.ServerCredentials.createInsecure() });
