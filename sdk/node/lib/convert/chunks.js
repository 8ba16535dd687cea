'use strict';
// Stream chunk objects ({type, payload}; data-* chunks {type, data}) <-> procmesh.v1.Chunk, with
// the usage and abort they carry. Usage and abort live here because a chunk (finish, tripwire) is
// where they first appear; ./turns reuses them for step results.

const { describe, fromStruct, fromValue, hasFields, str, toStruct, toValue } = require('./values');

function usageToProto(usage) {
  const u = usage || {};
  const input = Math.trunc(Number(u.inputTokens) || 0);
  const output = Math.trunc(Number(u.outputTokens) || 0);
  return { input_tokens: input, output_tokens: output, total_tokens: Math.trunc(Number(u.totalTokens) || input + output) };
}

function usageFromProto(usage) {
  const u = usage || {};
  return { inputTokens: u.input_tokens || 0, outputTokens: u.output_tokens || 0, totalTokens: u.total_tokens || 0 };
}

/** {reason, retry, metadata, processorId} as procmesh.v1.Abort (metadata null/undefined: absent). */
function abortToProto(abort) {
  const out = { reason: str(abort.reason), retry: Boolean(abort.retry), processor_id: str(abort.processorId) };
  if (abort.metadata !== undefined && abort.metadata !== null) out.metadata = toValue(abort.metadata);
  return out;
}

function abortFromProto(abort) {
  const a = abort || {};
  return {
    processorId: str(a.processor_id),
    reason: str(a.reason),
    retry: Boolean(a.retry),
    metadata: a.metadata ? fromValue(a.metadata) : null,
  };
}

/** A chunk object ({type, payload} or {type: 'data-...', data}) as procmesh.v1.Chunk. */
function chunkToProto(chunk) {
  if (!chunk || typeof chunk !== 'object' || typeof chunk.type !== 'string') {
    throw new TypeError(`a chunk must be an object with a string type, got ${describe(chunk)}`);
  }
  const kind = chunk.type;
  const payload = chunk.payload || {};
  const out = { type: kind };
  if (kind === 'text-delta') {
    out.text_delta = { text: str(payload.text), id: str(payload.id) };
  } else if (kind.startsWith('data-')) {
    out.data = toValue(chunk.data);
    out.transient = Boolean(chunk.transient);
  } else if (kind === 'tool-call') {
    out.tool_call = { tool_call_id: str(payload.toolCallId), tool_name: str(payload.toolName), args: toValue(payload.args) };
    // a client tool's call, as the orchestrator streams it
    if (payload.requestContext !== undefined) out.tool_call.request_context = toStruct(payload.requestContext);
  } else if (kind === 'tool-result') {
    out.tool_result = {
      tool_call_id: str(payload.toolCallId),
      tool_name: str(payload.toolName),
      args: toValue(payload.args),
      result: toValue(payload.result),
      provider_executed: Boolean(payload.providerExecuted),
    };
  } else if (kind === 'finish') {
    out.finish = { finish_reason: str(payload.finishReason), usage: usageToProto(payload.usage) };
    if (payload.metadata && Object.keys(payload.metadata).length) out.finish.metadata = toStruct(payload.metadata);
  } else if (kind === 'tripwire') {
    out.tripwire = abortToProto(payload);
  } else if (kind === 'error') {
    out.error = { message: String(payload.message ?? payload.error ?? '') };
  } else {
    out.other = toStruct(payload);
  }
  return out;
}

/** procmesh.v1.Chunk as a chunk object. */
function chunkFromProto(chunk) {
  const c = chunk || {};
  const type = str(c.type);
  const kind = c.payload || ['text_delta', 'tool_call', 'tool_result', 'finish', 'tripwire', 'error', 'data', 'other'].find((k) => c[k]);
  let payload;
  switch (kind) {
    case 'text_delta': {
      payload = { text: str(c.text_delta.text) };
      if (c.text_delta.id) payload.id = c.text_delta.id;
      return { type, payload };
    }
    case 'data': {
      const out = { type, data: fromValue(c.data) };
      if (c.transient) out.transient = true;
      return out;
    }
    case 'tool_call':
      payload = { toolCallId: str(c.tool_call.tool_call_id), toolName: str(c.tool_call.tool_name), args: fromValue(c.tool_call.args) };
      if (c.tool_call.request_context) payload.requestContext = fromStruct(c.tool_call.request_context);
      break;
    case 'tool_result': {
      const tr = c.tool_result;
      payload = { toolCallId: str(tr.tool_call_id), toolName: str(tr.tool_name), args: fromValue(tr.args), result: fromValue(tr.result) };
      if (tr.provider_executed) payload.providerExecuted = true;
      break;
    }
    case 'finish':
      payload = { finishReason: str(c.finish.finish_reason), usage: usageFromProto(c.finish.usage) };
      if (hasFields(c.finish.metadata)) payload.metadata = fromStruct(c.finish.metadata);
      break;
    case 'tripwire':
      payload = abortFromProto(c.tripwire);
      break;
    case 'error':
      payload = { message: str(c.error.message) };
      break;
    case 'other':
      payload = fromStruct(c.other);
      break;
    default:
      payload = {};
  }
  if (type.startsWith('data-')) return { type, data: null };
  return { type, payload };
}

module.exports = { abortFromProto, abortToProto, chunkFromProto, chunkToProto, usageFromProto, usageToProto };
