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

const { InvalidInputError } = require('./errors');

// -- JSON values -----------------------------------------------------------------------------

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

// -- messages -------------------------------------------------------------------------------

function partToProto(part) {
  if (!part || typeof part !== 'object') throw new TypeError('a message part must be an object');
  const kind = part.type;
  if (kind === 'text') return { text: { text: str(part.text) } };
  if (kind === 'reasoning') return { reasoning: { text: str(part.text) } };
  if (kind === 'tool-invocation') {
    const inv = part.toolInvocation || {};
    const ti = {
      state: inv.state || 'call',
      tool_call_id: str(inv.toolCallId),
      tool_name: str(inv.toolName),
      args: toValue(inv.args),
      error_text: str(inv.errorText),
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
    case 'reasoning':
      return { type: 'reasoning', text: str(part.reasoning.text) };
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
      return { type: 'tool-invocation', toolInvocation: inv };
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
      throw new InvalidInputError('message part has no kind set');
  }
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
    content: { format: 2, parts: (content.parts || []).map(partToProto) },
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
  const out = { id: str(msg.id), role: str(msg.role), content };
  if (msg.created_at) out.createdAt = msg.created_at;
  if (msg.thread_id) out.threadId = msg.thread_id;
  if (msg.resource_id) out.resourceId = msg.resource_id;
  if (msg.type) out.type = msg.type;
  return out;
}

// -- chunks ---------------------------------------------------------------------------------

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

// -- signals, prompts, steps, tools -----------------------------------------------------------

/** A sendSignal() object as procmesh.v1.Signal. */
function signalToProto(signal) {
  if (typeof signal.contents !== 'string') throw new TypeError('signal contents must be a string');
  const out = {
    type: signal.type || 'reactive',
    contents: signal.contents,
    tag_name: str(signal.tagName),
    attributes: Object.entries(signal.attributes || {}).map(([name, value]) => ({ name: String(name), value: toValue(value) })),
    transient: Boolean(signal.transient),
    id: str(signal.id),
  };
  if (signal.metadata && Object.keys(signal.metadata).length) out.metadata = toStruct(signal.metadata);
  return out;
}

function signalFromProto(signal) {
  const out = { type: signal.type || 'reactive', contents: str(signal.contents) };
  if (signal.tag_name) out.tagName = signal.tag_name;
  if (signal.attributes && signal.attributes.length) {
    out.attributes = Object.fromEntries(signal.attributes.map((a) => [a.name, fromValue(a.value)]));
  }
  if (signal.transient) out.transient = true;
  if (hasFields(signal.metadata)) out.metadata = fromStruct(signal.metadata);
  if (signal.id) out.id = signal.id;
  return out;
}

/** Provider-shaped prompt messages as repeated procmesh.v1.PromptMessage. */
function promptToProto(prompt) {
  if (!Array.isArray(prompt)) throw new TypeError(`a prompt must be an array, got ${describe(prompt)}`);
  return prompt.map((msg) => {
    if (!msg || typeof msg.role !== 'string') throw new TypeError('a prompt message needs a string role');
    if (typeof msg.content === 'string') return { role: msg.role, content: [{ type: 'text', text: msg.content }] };
    return {
      role: msg.role,
      content: (msg.content || []).map((src) => {
        const part = {
          type: str(src.type),
          text: str(src.text),
          tool_call_id: str(src.toolCallId),
          tool_name: str(src.toolName),
          media_type: str(src.mediaType),
        };
        if ('input' in src) part.input = toValue(src.input);
        if ('output' in src) part.output = toValue(src.output);
        const data = src.data ?? '';
        if (data instanceof Uint8Array) part.data = Buffer.from(data);
        else if (data) part.url = String(data);
        return part;
      }),
    };
  });
}

function promptFromProto(prompt) {
  return (prompt || []).map((pm) => {
    const parts = pm.content || [];
    if (pm.role === 'system') return { role: 'system', content: parts.map((p) => str(p.text)).join('\n') };
    return {
      role: str(pm.role),
      content: parts.map((p) => {
        const part = { type: str(p.type) };
        if (p.type === 'text' || p.type === 'reasoning') part.text = str(p.text);
        else if (p.type === 'tool-call') Object.assign(part, { toolCallId: str(p.tool_call_id), toolName: str(p.tool_name), input: fromValue(p.input) });
        else if (p.type === 'tool-result') Object.assign(part, { toolCallId: str(p.tool_call_id), toolName: str(p.tool_name), output: fromValue(p.output) });
        else if (p.type === 'file') Object.assign(part, { mediaType: str(p.media_type), data: p.data && p.data.length ? Buffer.from(p.data) : str(p.url) });
        return part;
      }),
    };
  });
}

function toolCallFromProto(c) {
  return { toolCallId: str(c.tool_call_id), toolName: str(c.tool_name), args: fromValue(c.args) };
}

/** procmesh.v1.StepResult as a step object. */
function stepFromProto(step) {
  return {
    stepNumber: step.step_number || 0,
    text: str(step.text),
    toolCalls: (step.tool_calls || []).map(toolCallFromProto),
    toolResults: (step.tool_results || []).map((r) => ({
      toolCallId: str(r.tool_call_id),
      toolName: str(r.tool_name),
      args: fromValue(r.args),
      result: fromValue(r.result),
    })),
    finishReason: str(step.finish_reason),
    usage: usageFromProto(step.usage),
    tripwire: step.tripwire ? abortFromProto(step.tripwire) : null,
  };
}

function stepToProto(step) {
  const out = {
    step_number: Math.trunc(Number(step.stepNumber) || 0),
    text: str(step.text),
    tool_calls: (step.toolCalls || []).map((c) => ({ tool_call_id: str(c.toolCallId), tool_name: str(c.toolName), args: toValue(c.args) })),
    tool_results: (step.toolResults || []).map((r) => ({
      tool_call_id: str(r.toolCallId),
      tool_name: str(r.toolName),
      args: toValue(r.args),
      result: toValue(r.result),
    })),
    finish_reason: str(step.finishReason),
    usage: usageToProto(step.usage),
  };
  if (step.tripwire) out.tripwire = abortToProto(step.tripwire);
  return out;
}

function toolFromProto(tool) {
  return { name: str(tool.name), description: str(tool.description), inputSchema: fromStruct(tool.input_schema) };
}

function toolToProto(tool) {
  if (!tool || typeof tool.name !== 'string') throw new TypeError(`a tool needs a string name, got ${describe(tool)}`);
  return { name: tool.name, description: str(tool.description), input_schema: toStruct(tool.inputSchema) };
}

// -- helpers --------------------------------------------------------------------------------

function str(value) {
  return value === undefined || value === null ? '' : String(value);
}

function describe(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

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
