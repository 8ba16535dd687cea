'use strict';
// Options validation: a processor's `optionsSchema` (a JSON schema) is reported by Describe and
// checked here on every call, as the Python SDK checks its pydantic `Options` model. Only a small
// subset of JSON schema is enforced: type, properties, required, additionalProperties: false,
// items, enum, minimum/maximum, minLength/maxLength and `default` (filled in for absent
// properties). Anything else in the schema is informational.

const TYPES = {
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
  array: Array.isArray,
  string: (v) => typeof v === 'string',
  number: (v) => typeof v === 'number',
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === 'boolean',
  null: (v) => v === null,
};

function clone(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

/** Validate `value` against `schema`; returns the value with defaults filled in, or throws Error(path: problem). */
function validate(schema, value, path = 'options') {
  if (!schema || typeof schema !== 'object') return value;
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => (TYPES[t] || (() => true))(value))) {
      throw new Error(`${path}: expected ${types.join(' or ')}, got ${JSON.stringify(value)}`);
    }
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) {
    throw new Error(`${path}: must be one of ${JSON.stringify(schema.enum)}, got ${JSON.stringify(value)}`);
  }
  if (typeof value === 'number') {
    if (typeof schema.minimum === 'number' && value < schema.minimum) throw new Error(`${path}: must be >= ${schema.minimum}`);
    if (typeof schema.maximum === 'number' && value > schema.maximum) throw new Error(`${path}: must be <= ${schema.maximum}`);
  }
  if (typeof value === 'string') {
    if (typeof schema.minLength === 'number' && value.length < schema.minLength) throw new Error(`${path}: shorter than ${schema.minLength}`);
    if (typeof schema.maxLength === 'number' && value.length > schema.maxLength) throw new Error(`${path}: longer than ${schema.maxLength}`);
  }
  if (Array.isArray(value) && schema.items && typeof schema.items === 'object') {
    return value.map((item, i) => validate(schema.items, item, `${path}[${i}]`));
  }
  if (TYPES.object(value) && (schema.properties || schema.required || schema.additionalProperties === false)) {
    const props = schema.properties || {};
    const out = { ...value };
    if (schema.additionalProperties === false) {
      const unknown = Object.keys(value).filter((k) => !(k in props)).sort();
      if (unknown.length) {
        throw new Error(`${path}: unknown keys ${JSON.stringify(unknown)} (accepted: ${JSON.stringify(Object.keys(props).sort())})`);
      }
    }
    for (const [key, sub] of Object.entries(props)) {
      if (key in value) out[key] = validate(sub, value[key], `${path}.${key}`);
      else if (sub && typeof sub === 'object' && 'default' in sub) out[key] = clone(sub.default);
    }
    for (const key of schema.required || []) {
      if (!(key in out)) throw new Error(`${path}: '${key}' is required`);
    }
    return out;
  }
  return value;
}

module.exports = { validate };
