'use strict';
// Message parts of a kind this SDK does not know (a newer orchestrator's, or none at all) pass
// through untouched (proto/README.md, forward compatibility): protobufjs drops unknown fields, so
// a request holding such a part is decoded again here with a copy of the contract whose Part keeps
// its bytes, hooks see `{type: 'procmesh-unknown', proto: <base64>}`, and a response that returns
// it is encoded with the same copy, which writes those bytes back as they came. Requests without
// such a part (all of them, from an orchestrator of this release) never take this path.

const fs = require('fs');
const path = require('path');
const { LOADER_OPTIONS, protoDir } = require('./contract');

// The protobufjs that @grpc/proto-loader loads the contract with (its dependency, not ours).
const protobuf = require(require.resolve('protobufjs', { paths: [path.dirname(require.resolve('@grpc/proto-loader'))] }));

/** The key under which a decoded Part keeps its bytes (a Buffer). */
const RAW = '__procmeshRawPart';
const UNKNOWN_PART = 'procmesh-unknown';
const KINDS = ['text', 'reasoning', 'tool_invocation', 'file', 'data', 'step_start'];
const MESSAGE_FIELDS = ['messages', 'all_messages', 'system_messages'];

function writeRaw(val, buf, pos) {
  for (let i = 0; i < val.length; i += 1) buf[pos + i] = val[i];
}

let root = null;
/** procmesh/v1/processor.proto loaded as @grpc/proto-loader does, with Part keeping its bytes. */
function contractRoot() {
  if (root !== null) return root;
  const dir = protoDir();
  const r = new protobuf.Root();
  const fallback = r.resolvePath;
  r.resolvePath = (origin, target) => {
    const full = path.join(dir, target);
    return fs.existsSync(full) ? full : fallback(origin, target);
  };
  r.loadSync('procmesh/v1/processor.proto', LOADER_OPTIONS).resolveAll();
  const Part = r.lookupType('procmesh.v1.Part');
  Part.setup();
  const { decode, encode, fromObject, toObject } = Part;
  Part.decode = function decodeKeepingBytes(reader, length) {
    const rd = reader instanceof protobuf.Reader ? reader : protobuf.Reader.create(reader);
    const start = rd.pos;
    const m = decode.call(this, rd, length);
    if (!KINDS.some((k) => m[k] !== null && m[k] !== undefined)) m[RAW] = Buffer.from(rd.buf.subarray(start, rd.pos));
    return m;
  };
  Part.toObject = function toObjectKeepingBytes(m, o) {
    const d = toObject.call(this, m, o);
    if (m[RAW] !== undefined) d[RAW] = m[RAW];
    return d;
  };
  Part.fromObject = function fromObjectKeepingBytes(d) {
    const m = fromObject.call(this, d);
    if (d && d[RAW] !== undefined) m[RAW] = d[RAW];
    return m;
  };
  Part.encode = function encodeKeepingBytes(m, w) {
    if (m[RAW] === undefined) return encode.call(this, m, w);
    const out = w || protobuf.Writer.create();
    out._push(writeRaw, m[RAW].length, m[RAW]);
    return out;
  };
  root = r;
  return root;
}

function someMessagePart(obj, test) {
  if (!obj || typeof obj !== 'object') return false;
  return MESSAGE_FIELDS.some((f) => Array.isArray(obj[f]) && obj[f].some((msg) => ((msg && msg.content && msg.content.parts) || []).some(test)));
}

const kindless = (part) => !part || !part.kind;
const carriesBytes = (part) => part && part[RAW] !== undefined;

function rpcTypes(rpc) {
  const method = contractRoot().lookupService('procmesh.v1.ProcessorService').methods[rpc];
  return { request: method.resolvedRequestType, response: method.resolvedResponseType };
}

/**
 * RPC `rpc`'s request decoder that keeps unknown parts: `decoder(buf)` as usual, decoded again
 * with the contract copy when a message part in it has no kind this SDK knows.
 */
function keepUnknownParts(rpc, decoder) {
  return (buf) => {
    const obj = decoder(buf);
    if (!someMessagePart(obj, kindless)) return obj;
    const { request } = rpcTypes(rpc);
    return request.toObject(request.decode(buf), LOADER_OPTIONS);
  };
}

/** RPC `rpc`'s response serializer `serialize`, writing unknown parts back as they came. */
function writeUnknownParts(rpc, serialize) {
  return (obj) => {
    if (!someMessagePart(obj, carriesBytes)) return serialize(obj);
    const { response } = rpcTypes(rpc);
    return Buffer.from(response.encode(response.fromObject(obj)).finish());
  };
}

/** A hook's view of a part that carries only its bytes. */
function unknownPartFromProto(part) {
  return { type: UNKNOWN_PART, proto: Buffer.from(part[RAW] || []).toString('base64') };
}

/** The wire form of a hook's `procmesh-unknown` part: its bytes, as they came. */
function unknownPartToProto(part) {
  return { [RAW]: Buffer.from(String(part.proto || ''), 'base64') };
}

module.exports = { RAW, UNKNOWN_PART, keepUnknownParts, unknownPartFromProto, unknownPartToProto, writeUnknownParts };
