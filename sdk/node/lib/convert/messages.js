'use strict';
// MastraDBMessage objects <-> procmesh.v1.Message (with its parts).

const { InvalidInputError } = require('../errors');
const { RAW, UNKNOWN_PART, unknownPartFromProto, unknownPartToProto } = require('../unknown');
const { describe, fromStruct, fromValue, hasFields, str, toStruct, toValue } = require('./values');

/**
 * A part's provenance as flat keys (only those known): the provider that produced it, a reasoning
 * part's signature, whether the provider executed a tool call itself. Read from flat keys, else
 * from the reference's providerMetadata ({anthropic: {signature}}) and details[].signature
 * (the Python SDK's part_provenance).
 */
function partProvenance(part, invocation) {
  const inv = invocation || {};
  let metadata = part.providerMetadata || inv.providerMetadata || {};
  if (!metadata || typeof metadata !== 'object' || Array.isArray(metadata)) metadata = {};
  // "mastra" is the reference's own namespace there (e.g. a tool's modelOutput), not a provider
  const provider = part.provider || inv.provider || Object.keys(metadata).find((k) => k !== 'mastra') || '';
  const out = {};
  if (provider) out.provider = String(provider);
  if (part.providerExecuted || inv.providerExecuted) out.providerExecuted = true;
  if (part.type === 'reasoning') {
    let signature = part.signature || (metadata[provider] || {}).signature;
    for (const detail of part.details || []) signature = signature || (detail && detail.signature);
    if (signature) out.signature = String(signature);
  }
  return out;
}

function partToProto(part) {
  if (!part || typeof part !== 'object') throw new TypeError('a message part must be an object');
  const kind = part.type;
  if (kind === 'text') return { text: { text: str(part.text) } };
  if (kind === 'reasoning') {
    const origin = partProvenance(part);
    return { reasoning: { text: str(part.text), signature: str(origin.signature), provider: str(origin.provider) } };
  }
  if (kind === 'tool-invocation') {
    const inv = part.toolInvocation || {};
    const origin = partProvenance(part, inv);
    const ti = {
      state: inv.state || 'call',
      tool_call_id: str(inv.toolCallId),
      tool_name: str(inv.toolName),
      args: toValue(inv.args),
      error_text: str(inv.errorText),
      provider_executed: Boolean(origin.providerExecuted),
      provider: str(origin.provider),
    };
    if ('result' in inv) ti.result = toValue(inv.result);
    return { tool_invocation: ti };
  }
  if (kind === 'file' || kind === 'image') {
    const fp = { media_type: str(part.mediaType ?? part.mimeType), filename: str(part.filename) };
    const data = part.data ?? part.url ?? '';
    if (data instanceof Uint8Array) fp.data = Buffer.from(data);
    else fp.url = String(data || '');
    return { file: fp };
  }
  if (kind === 'step-start') return { step_start: {} };
  if (kind === UNKNOWN_PART) return unknownPartToProto(part);
  if (typeof kind === 'string' && kind.startsWith('data-')) {
    return { data: { type: kind, data: toValue(part.data) } };
  }
  throw new TypeError(`unsupported message part type ${JSON.stringify(kind)}`);
}

function partFromProto(part) {
  const kind = part && (part.kind || ['text', 'reasoning', 'tool_invocation', 'file', 'data', 'step_start'].find((k) => part[k]));
  switch (kind) {
    case 'text':
      return { type: 'text', text: str(part.text.text) };
    case 'reasoning': {
      const out = { type: 'reasoning', text: str(part.reasoning.text) };
      if (part.reasoning.provider) out.provider = part.reasoning.provider;
      if (part.reasoning.signature) out.signature = part.reasoning.signature;
      return out;
    }
    case 'tool_invocation': {
      const ti = part.tool_invocation;
      const inv = {
        state: str(ti.state),
        toolCallId: str(ti.tool_call_id),
        toolName: str(ti.tool_name),
        args: fromValue(ti.args),
      };
      if (ti.result) inv.result = fromValue(ti.result);
      if (ti.error_text) inv.errorText = ti.error_text;
      const out = { type: 'tool-invocation', toolInvocation: inv };
      if (ti.provider) out.provider = ti.provider;
      if (ti.provider_executed) out.providerExecuted = true;
      return out;
    }
    case 'file': {
      const fp = part.file;
      const out = { type: 'file', mediaType: str(fp.media_type) };
      out.data = fp.data && fp.data.length ? Buffer.from(fp.data) : str(fp.url);
      if (fp.filename) out.filename = fp.filename;
      return out;
    }
    case 'data':
      return { type: str(part.data.type), data: fromValue(part.data.data) };
    case 'step_start':
      return { type: 'step-start' };
    default:
      // A kind this SDK does not know (a newer orchestrator's, or none): passed through as bytes.
      if (part && part[RAW] !== undefined) return unknownPartFromProto(part);
      throw new InvalidInputError('message part has no kind set');
  }
}

/** The legacy flattened `content.content`: the text parts joined with newlines. */
function flatText(parts) {
  return parts.filter((p) => p && p.type === 'text').map((p) => String(p.text ?? '')).join('\n');
}

/**
 * A content's parts; a content whose only text is the legacy flattened `content.content` string
 * gets it as a text part (the reference's fallback: a hook or an older client may set only that).
 */
function withFlatText(content) {
  const parts = [...(content.parts || [])];
  const flat = content.content;
  if (typeof flat === 'string' && flat && !parts.some((p) => p && p.type === 'text')) parts.push({ type: 'text', text: flat });
  return parts;
}

/** A MastraDBMessage object as procmesh.v1.Message. */
function messageToProto(msg) {
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) {
    throw new TypeError(`a message must be an object, got ${describe(msg)}`);
  }
  let content = msg.content || {};
  if (typeof content === 'string') content = { parts: [{ type: 'text', text: content }] };
  const out = {
    id: str(msg.id),
    role: str(msg.role),
    content: { format: 2, parts: withFlatText(content).map(partToProto) },
    created_at: msg.createdAt instanceof Date ? msg.createdAt.toISOString() : str(msg.createdAt),
    thread_id: str(msg.threadId),
    resource_id: str(msg.resourceId),
    type: str(msg.type),
  };
  if (content.metadata && Object.keys(content.metadata).length) out.content.metadata = toStruct(content.metadata);
  return out;
}

/** procmesh.v1.Message as a MastraDBMessage object. */
function messageFromProto(msg) {
  const c = msg.content || {};
  const content = { format: 2, parts: (c.parts || []).map(partFromProto) };
  if (hasFields(c.metadata)) content.metadata = fromStruct(c.metadata);
  // The seeds' legacy fallback: `content.content` reads the text parts joined (not enumerable:
  // not in the message's JSON nor in comparisons; a hook that sets it sets a plain property).
  Object.defineProperty(content, 'content', {
    get: () => flatText(content.parts) || undefined,
    set(value) {
      Object.defineProperty(content, 'content', { value, writable: true, enumerable: true, configurable: true });
    },
    enumerable: false,
    configurable: true,
  });
  const out = { id: str(msg.id), role: str(msg.role), content };
  if (msg.created_at) out.createdAt = msg.created_at;
  if (msg.thread_id) out.threadId = msg.thread_id;
  if (msg.resource_id) out.resourceId = msg.resource_id;
  if (msg.type) out.type = msg.type;
  return out;
}

module.exports = { messageFromProto, messageToProto };
