'use strict';
// Hosted tools: standalone tools a sidecar serves beside its processors, which agent configs name
// (the twin of the Python SDK's procmesh/_tool.py). Describe lists them (DescribeResponse.tools);
// ExecuteTool with an empty context.processor_id runs the one named tool_name. A tool is a plain
// object: {name, description, inputSchema, async execute(args, ctx)}, optional setup()/teardown()
// and toModelOutput(result) (what the model sees of the result; the caller keeps the result).
// ctx.writer.custom({type: 'data-...', data}) emits data chunks (ToolWriter).
// ctx.suspend(payload) suspends the call (resumed, ctx.resumeData holds the caller's data; the
// tool's resumeSchema tells what it expects); onInputStart / onInputAvailable / onOutput are its
// lifecycle hooks (servicer.js calls them).
// What execute() throws is the tool's error (ExecuteToolResponse.error), not a failed call; a
// ProcmeshError keeps its status. The SDK does not validate args against inputSchema (the
// orchestrator does).

const convert = require('./convert');
const { quote } = require('./effects');

/** What every model provider accepts as a tool name (OpenAI's and Anthropic's rule). */
const NAME = /^[A-Za-z0-9_-]{1,64}$/;
/** A tool error longer than this is clipped: the model reads it, and it costs context. */
const ERROR_CHARS = 2048;

function isPlainObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** One hosted tool, checked when the server is built (a bad one is a TypeError at start). */
class HostedTool {
  constructor(tool) {
    if (!isPlainObject(tool)) throw new TypeError(`a tool must be an object, got ${convert.describe(tool)}`);
    const { name } = tool;
    if (typeof name !== 'string' || !name) throw new TypeError('a tool has no name (a non-empty string)');
    if (!NAME.test(name)) throw new TypeError(`tool name ${quote(name)} must be 1-64 letters, digits, '_' or '-'`);
    if (typeof tool.execute !== 'function') throw new TypeError(`tool ${quote(name)} has no execute() function`);
    const schema = tool.inputSchema === undefined || tool.inputSchema === null ? { type: 'object' } : tool.inputSchema;
    if (!isPlainObject(schema) || schema.type !== 'object') {
      throw new TypeError(`tool ${quote(name)}: inputSchema must be a JSON schema object ({type: 'object', ...})`);
    }
    try {
      this.schema = convert.toStruct(schema);
    } catch (err) {
      throw new TypeError(`tool ${quote(name)}: inputSchema is not JSON: ${err.message}`);
    }
    this.tool = tool;
    this.name = name;
  }

  /** Its HostedTool message for Describe. */
  info() {
    return { name: this.name, description: this.tool.description || '', input_schema: this.schema };
  }
}

/** What the model sees of what a tool threw: its message (else its name), clipped. */
function errorText(err) {
  let text = err instanceof Error ? err.message : String(err);
  if (!text) text = (err && err.name) || 'Error';
  if (text.length <= ERROR_CHARS) return text;
  return `${text.slice(0, ERROR_CHARS - 30)}... (${text.length} characters)`;
}

/** Thrown inside the servicer when a tool threw an ordinary error: answered as ExecuteToolResponse.error. */
class ToolRaised extends Error {
  constructor(cause) {
    super(errorText(cause));
    this.name = 'ToolRaised';
    this.cause = cause;
    /** The metrics' outcome label. */
    this.outcome = 'tool_error';
  }
}

/**
 * A hosted tool's `ctx.writer`: `custom()` emits a data-* chunk (the seeds' writer.custom()). The
 * chunks go back with the call's answer (ExecuteToolResponse.effects.custom_chunks), in the order
 * written; the orchestrator emits them at the call's turn, before its tool-result. A chunk of
 * another type is the tool's error (thrown as an ordinary Error, as a bug in the tool is).
 */
class ToolWriter {
  constructor() {
    this.chunks = [];
  }

  /** Emit `{ type: 'data-...', data, transient? }`. */
  async custom(chunk) {
    const kind = isPlainObject(chunk) ? chunk.type : undefined;
    if (typeof kind !== 'string' || !kind.startsWith('data-')) {
      throw new Error(`writer.custom: chunk type must start with 'data-', got ${JSON.stringify(kind ?? null)}`);
    }
    this.chunks.push({ ...chunk });
  }
}

module.exports = { ERROR_CHARS, HostedTool, ToolRaised, ToolWriter, errorText };
