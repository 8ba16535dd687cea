'use strict';
// Conversion between the wire objects of procmesh.v1 (as @grpc/proto-loader hands them over:
// snake_case fields, oneof names in a virtual property, google.protobuf.Struct/Value in
// protobufjs' camelCase form) and the plain JSON shapes hooks see. This is the Node twin of the
// Python SDK's `procmesh.convert`: messages are MastraDBMessage objects
// ({id, role, content: {format: 2, parts, metadata}}), chunks are {type, payload} and data-*
// chunks {type, data}.
//
// Functions named `...FromProto` read requests: a malformed request throws `InvalidInputError`.
// Functions named `...ToProto` encode what a hook returned: they throw TypeError on values that
// have no wire form (the server reports those as INTERNAL, the processor's fault).
//
// This file is the face only (`require('./convert')` resolves to it before the ./convert/
// folder); the mappings live in ./convert/, one module per kind of record, as in the Python SDK.
// The exports stay a literal object of plain names, as in index.js: Node's CommonJS named-export
// detection (cjs-module-lexer) reads only that form, so ES-module importers still see each name.

const { NULL, describe, fromStruct, fromValue, toStruct, toValue } = require('./convert/values');
const { messageFromProto, messageToProto } = require('./convert/messages');
const {
  abortFromProto,
  abortToProto,
  chunkFromProto,
  chunkToProto,
  usageFromProto,
  usageToProto,
} = require('./convert/chunks');
const {
  promptFromProto,
  promptToProto,
  signalFromProto,
  signalToProto,
  stepFromProto,
  stepToProto,
  toolCallFromProto,
  toolFromProto,
  toolToProto,
} = require('./convert/turns');

module.exports = {
  NULL,
  abortFromProto,
  abortToProto,
  chunkFromProto,
  chunkToProto,
  describe,
  fromStruct,
  fromValue,
  messageFromProto,
  messageToProto,
  promptFromProto,
  promptToProto,
  signalFromProto,
  signalToProto,
  stepFromProto,
  stepToProto,
  toStruct,
  toValue,
  toolCallFromProto,
  toolFromProto,
  toolToProto,
  usageFromProto,
  usageToProto,
};
