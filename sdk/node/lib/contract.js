'use strict';
// The contract: where procmesh/v1/*.proto is found and how it is loaded for @grpc/grpc-js.

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const SERVICE_NAME = 'procmesh.v1.ProcessorService';

/**
 * Where procmesh/v1/*.proto is read from: $PROCMESH_PROTO_DIR, else the copy a packed package
 * carries (./proto, made by `npm pack`), else the repository's proto/ (this package lives in
 * sdk/node of the procmesh repository, so the contract has one source of truth there).
 */
function protoDir() {
  const candidates = [process.env.PROCMESH_PROTO_DIR, path.join(__dirname, '..', 'proto'), path.join(__dirname, '..', '..', '..', 'proto')];
  for (const dir of candidates) {
    if (dir && fs.existsSync(path.join(dir, 'procmesh', 'v1', 'processor.proto'))) return dir;
  }
  throw new Error(`procmesh/v1/processor.proto not found in ${candidates.filter(Boolean).join(', ')} (set PROCMESH_PROTO_DIR)`);
}

/** The loader options: snake_case fields, enum names, oneof names, no implicit defaults (presence matters). */
const LOADER_OPTIONS = { keepCase: true, enums: String, longs: Number, defaults: false, oneofs: true, arrays: true };

let cachedPackage = null;
/** The loaded procmesh.v1 package (`.ProcessorService`, message types) for @grpc/grpc-js. */
function loadContract() {
  if (cachedPackage === null) {
    const def = protoLoader.loadSync('procmesh/v1/processor.proto', { ...LOADER_OPTIONS, includeDirs: [protoDir()] });
    cachedPackage = grpc.loadPackageDefinition(def).procmesh.v1;
  }
  return cachedPackage;
}

module.exports = { LOADER_OPTIONS, SERVICE_NAME, loadContract, protoDir };
