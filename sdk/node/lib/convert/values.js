'use strict';
// JSON values <-> google.protobuf.Value/Struct (protobufjs' camelCase form), and the small
// scalar helpers (str, describe) every other mapping in ./convert uses.

const NULL = Object.freeze({ nullValue: 'NULL_VALUE' });

/** A JSON-compatible JS value as google.protobuf.Value. */
function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  switch (typeof value) {
    case 'boolean':
      return { boolValue: value };
    case 'number':
      return { numberValue: value };
    case 'string':
      return { stringValue: value };
    case 'object':
      break;
    default:
      throw new TypeError(`a value of type ${typeof value} is not JSON-serializable`);
  }
  if (Array.isArray(value)) {
    return { listValue: { values: value.map((item) => toValue(item)) } };
  }
  if (ArrayBuffer.isView(value)) {
    throw new TypeError('binary data is not JSON-serializable');
  }
  if (typeof value.toJSON === 'function') return toValue(value.toJSON());
  return { structValue: toStruct(value) };
}

/** A plain object as google.protobuf.Struct (null/undefined give an empty Struct). */
function toStruct(obj) {
  const fields = {};
  if (obj === null || obj === undefined) return { fields };
  if (typeof obj !== 'object' || Array.isArray(obj)) {
    throw new TypeError(`expected a JSON object, got ${Array.isArray(obj) ? 'an array' : typeof obj}`);
  }
  for (const [key, item] of Object.entries(obj)) {
    if (item === undefined) continue; // as JSON.stringify does
    fields[key] = toValue(item);
  }
  return { fields };
}

/** google.protobuf.Value as a JS value (numbers stay numbers; an unset Value is null). */
function fromValue(value) {
  if (value === null || value === undefined) return null;
  const kind = value.kind || kindOf(value);
  switch (kind) {
    case 'stringValue':
      return value.stringValue;
    case 'numberValue':
      return value.numberValue;
    case 'boolValue':
      return value.boolValue;
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return ((value.listValue && value.listValue.values) || []).map(fromValue);
    default:
      return null;
  }
}

function kindOf(value) {
  for (const key of ['stringValue', 'numberValue', 'boolValue', 'structValue', 'listValue', 'nullValue']) {
    if (value[key] !== undefined && value[key] !== null) return key;
  }
  return undefined;
}

/** google.protobuf.Struct as a plain object. */
function fromStruct(struct) {
  const out = {};
  if (!struct || !struct.fields) return out;
  for (const [key, value] of Object.entries(struct.fields)) out[key] = fromValue(value);
  return out;
}

function hasFields(struct) {
  return Boolean(struct && struct.fields && Object.keys(struct.fields).length);
}

// -- helpers shared by the other mappings -----------------------------------------------------

function str(value) {
  return value === undefined || value === null ? '' : String(value);
}

function describe(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

module.exports = { NULL, describe, fromStruct, fromValue, hasFields, str, toStruct, toValue };
