'use strict';
// Signals, provider prompts, step results and tool definitions <-> their procmesh.v1 messages:
// the per-turn records around the messages and chunks.

const { abortFromProto, abortToProto, usageFromProto, usageToProto } = require('./chunks');
const { describe, fromStruct, fromValue, hasFields, str, toStruct, toValue } = require('./values');

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
          filename: str(src.filename),
          provider_executed: Boolean(src.providerExecuted),
          provider: str(src.provider),
          signature: str(src.signature),
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
        else if (p.type === 'file') {
          Object.assign(part, { mediaType: str(p.media_type), data: p.data && p.data.length ? Buffer.from(p.data) : str(p.url) });
          if (p.filename) part.filename = p.filename;
        }
        if (p.provider) part.provider = p.provider;
        if (p.provider_executed) part.providerExecuted = true;
        if (p.signature) part.signature = p.signature;
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

module.exports = {
  promptFromProto,
  promptToProto,
  signalFromProto,
  signalToProto,
  stepFromProto,
  stepToProto,
  toolCallFromProto,
  toolFromProto,
  toolToProto,
};
