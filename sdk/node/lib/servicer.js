'use strict';
// The servicer: the hosted processors, and one handler per ProcessorService RPC derived from the
// hook table (./hooks): every unary hook shares one skeleton (look up, decode, call, encode) with
// its codec (./codecs); the output stream has its own (./stream). ExecuteTool with an empty
// processor_id runs a hosted tool (./tools); what a tool (or executeTool) throws is its error.

const convert = require('./convert');
const { CODECS } = require('./codecs');
const { fillEffects, quote, toStatus } = require('./effects');
const { InternalError, InvalidInputError, NotFoundError, NotReadyError, ProcmeshError, UnimplementedError } = require('./errors');
const { HOOKS, HOOK_NAMES } = require('./hooks');
const { RejectLog, decode, short } = require('./guard');
const { models, noteDeadline } = require('./model');
const { validate } = require('./options');
const { HookEffects, RequestContext, TripWire, Writer } = require('./processor');
const { outputStream } = require('./stream');
const { runFused } = require('./fused');
const { ToolRaised, ToolWriter } = require('./tools');
const tracing = require('./tracing');
const { version } = require('../package.json');

/** One hosted processor: its id, the hooks it implements, its options schema. */
class Hosted {
  constructor(processor) {
    if (!processor || typeof processor !== 'object') throw new TypeError(`a processor must be an object, got ${convert.describe(processor)}`);
    const cls = (processor.constructor && processor.constructor.name) || 'processor';
    if (typeof processor.id !== 'string' || !processor.id) throw new TypeError(`${cls} has no id (a non-empty string)`);
    this.processor = processor;
    this.id = processor.id;
    this.hooks = new Set(HOOK_NAMES.filter((name) => typeof processor[name] === 'function'));
    const schema = processor.optionsSchema;
    if (schema !== undefined && schema !== null && (typeof schema !== 'object' || Array.isArray(schema))) {
      throw new TypeError(`processor ${quote(this.id)}: optionsSchema must be a JSON schema object`);
    }
    this.schema = schema || null;
  }

  /** Its ProcessorInfo for Describe: the hooks it implements, in the table's (the enum's) order. */
  info() {
    const p = this.processor;
    return {
      id: this.id,
      name: p.name || this.id,
      description: p.description || '',
      hooks: HOOKS.filter((h) => this.hooks.has(h.name)).map((h) => h.enumName),
      process_data_parts: Boolean(p.processDataParts),
      options_schema_json: this.schema ? JSON.stringify(this.schema) : '',
      speculative: Boolean(p.speculative),
    };
  }

  /** The request's options, validated by the schema and parseOptions(); invalid: INVALID_ARGUMENT. */
  options(struct) {
    let options = convert.fromStruct(struct);
    try {
      if (this.schema) options = validate(this.schema, options);
      if (typeof this.processor.parseOptions === 'function') options = this.processor.parseOptions(options);
    } catch (err) {
      if (err instanceof ProcmeshError) throw err;
      throw new InvalidInputError(`invalid options for processor ${quote(this.id)}: ${err && err.message ? err.message : String(err)}`);
    }
    return options;
  }
}

/** The call's deadline in epoch milliseconds (Infinity when it has none). */
function deadlineOf(call) {
  const deadline = call.getDeadline ? call.getDeadline() : Infinity;
  return deadline instanceof Date ? deadline.getTime() : Number(deadline);
}

/** `fn()` inside a hook span: its answer's outcome (`outcome(resp)`), or failure when it throws. */
async function traced(span, fn, outcome) {
  let resp;
  try {
    resp = await fn();
  } catch (err) {
    span.outcome('failure');
    throw err;
  }
  span.outcome(outcome(resp));
  return resp;
}

/** The RPC handlers' shared part: processor lookup, base arguments, calling a hook. */
class Servicer {
  constructor(hosted, log, tools = new Map()) {
    this.hosted = hosted;
    /** The hosted tools by name (./tools HostedTool). */
    this.tools = tools;
    this.log = log;
    /** Refused requests: counted, and logged as one rate-limited WARNING. */
    this.rejects = new RejectLog(log);
    /** Hooks are served only once every processor's setup() resolved. */
    this.ready = false;
  }

  /** The hosted processor the request names, if it is ready and implements `hook`. */
  lookup(ctx, hook) {
    if (!this.ready) throw new NotReadyError('the sidecar is starting or draining; retry when health reports SERVING');
    const id = ctx && ctx.processor_id;
    if (!id) throw new InvalidInputError('request.context.processor_id is required');
    const hosted = this.hosted.get(id);
    if (!hosted) {
      throw new NotFoundError(`processor ${short(id)} is not hosted here (hosted: ${JSON.stringify([...this.hosted.keys()].sort())})`);
    }
    if (!hosted.hooks.has(hook)) throw new UnimplementedError(`processor ${quote(hosted.id)} does not implement ${hook}`);
    return hosted;
  }

  /** The further processors a fused request names (`context.fused`), each as lookup() finds it. */
  lookupFused(ctx, hook) {
    return ((ctx && ctx.fused) || []).map((member) => this.lookup(member, hook));
  }

  /**
   * The arguments every hook receives (hooks.BASE_ARGUMENTS), from the request's context. For a
   * further processor of a fused request, `member` (its `context.fused` entry) gives its own
   * options and state; the rest of the context is the request's.
   */
  baseArgs(hosted, ctx, effects, signal, member = null) {
    const own = member || ctx;
    return {
      abort: effects.abortHook,
      state: convert.fromStruct(own.state),
      options: hosted.options(own.options),
      retryCount: ctx.retry_count || 0,
      stepNumber: ctx.step_number || 0,
      runId: ctx.run_id || '',
      agentId: ctx.agent_id || '',
      threadId: ctx.thread_id || undefined,
      resourceId: ctx.resource_id || undefined,
      onFailure: own.on_failure || undefined,
      requestContext: new RequestContext(convert.fromStruct(ctx.request_context), effects.contextUpdates),
      sendSignal: effects.sendSignal,
      writer: new Writer(effects),
      reportViolation: effects.reportViolation,
      abortSignal: signal,
      model: models({ ...ctx, processor_id: hosted.id }, signal, this.log),
    };
  }

  /**
   * Run one hook; a TripWire becomes the abort effect, anything else it throws is INTERNAL.
   * `quiet`: a replay that rebuilds state after a rewind (./rewind), neither timed nor counted.
   */
  async callHook(hosted, hook, args, effects, quiet = false) {
    try {
      return await hosted.processor[hook](args);
    } catch (err) {
      if (err instanceof TripWire) {
        effects.abort = err;
        return undefined;
      }
      if (err instanceof ProcmeshError) throw err;
      if (hook === 'executeTool') {
        // a tool's error is data for the model, not a failed call (ExecuteToolResponse.error)
        this.log.warn(`processor ${hosted.id} tool raised`, err && err.stack ? err.stack : err);
        throw new ToolRaised(err);
      }
      const kind = (err && err.name) || typeof err;
      const message = err && err.message !== undefined ? err.message : String(err);
      this.log.error(`processor ${hosted.id} hook ${hook} raised`, err && err.stack ? err.stack : err);
      throw new InternalError(`processor ${quote(hosted.id)} hook ${hook} raised ${kind}: ${message}`);
    }
  }

  /** The hosted tool an ExecuteTool request with an empty processor_id names. */
  lookupTool(name) {
    if (!this.ready) throw new NotReadyError('the sidecar is starting or draining; retry when health reports SERVING');
    const tool = this.tools.get(name || '');
    if (!tool) {
      throw new NotFoundError(`tool ${short(name || '')} is not hosted here (hosted tools: ${JSON.stringify([...this.tools.keys()].sort())})`);
    }
    return tool;
  }

  /** Run a hosted tool's execute(), then its toModelOutput(result) if it has one: `{result, shown}`;
   * an ordinary error becomes ToolRaised (a ProcmeshError stays). */
  async runTool(tool, args, ctx) {
    try {
      const result = await tool.tool.execute(args, ctx);
      if (typeof tool.tool.toModelOutput !== 'function') return { result };
      return { result, shown: await tool.tool.toModelOutput(result) };
    } catch (err) {
      if (err instanceof ProcmeshError) throw err;
      this.log.warn(`tool ${tool.name} raised`, err && err.stack ? err.stack : err);
      throw new ToolRaised(err);
    }
  }

  /** Call one of a tool's lifecycle hooks, if it has it (the reference's onInputStart,
   * onInputAvailable, onOutput): what it throws is logged, never the call's failure. */
  async lifecycle(tool, name, options) {
    if (typeof tool.tool[name] !== 'function') return;
    try {
      await tool.tool[name](options);
    } catch (err) {
      this.log.error(`tool ${tool.name}: ${name} threw`, err && err.stack ? err.stack : err);
    }
  }

  /** A hosted tool call (`tool` from lookupTool): its context, execute(), the result or the error it threw. */
  async callTool(req, signal, tool = this.lookupTool(req.tool_name)) {
    const c = req.context || {};
    let messages;
    try {
      messages = (req.messages || []).map(convert.messageFromProto);
    } catch (err) {
      this.rejects.note('executeTool', (err && err.name) || typeof err, err && err.message);
      throw new InvalidInputError(`malformed executeTool request: ${err && err.message ? err.message : String(err)}`);
    }
    const ctx = {
      runId: c.run_id || '',
      agentId: c.agent_id || '',
      toolCallId: req.tool_call_id || '',
      threadId: c.thread_id || undefined,
      resourceId: c.resource_id || undefined,
      requestContext: new RequestContext(convert.fromStruct(c.request_context)),
      messages,
      abortSignal: signal,
      writer: new ToolWriter(),
    };
    const suspension = suspensionOf(req, ctx);
    const args = req.args === undefined || req.args === null ? {} : convert.fromValue(req.args);
    const hook = { toolCallId: ctx.toolCallId, messages, abortSignal: signal };
    await this.lifecycle(tool, 'onInputStart', hook);
    await this.lifecycle(tool, 'onInputAvailable', { ...hook, input: args });
    let result;
    let shown;
    try {
      ({ result, shown } = await this.runTool(tool, args, ctx));
    } catch (err) {
      if (err instanceof ToolRaised) return { error: err.message };
      throw err;
    }
    if (suspension.asked) return suspendedAnswer(tool, suspension, ctx);
    await this.lifecycle(tool, 'onOutput', { toolCallId: ctx.toolCallId, toolName: tool.name, output: result, abortSignal: signal });
    try {
      const answer = { result: convert.toValue(result === undefined ? null : result) };
      if (typeof tool.tool.toModelOutput === 'function') answer.model_output = convert.toValue(shown === undefined ? null : shown);
      if (ctx.writer.chunks.length) answer.effects = { custom_chunks: ctx.writer.chunks.map(convert.chunkToProto) };
      return answer;
    } catch (err) {
      throw new InternalError(`tool ${quote(tool.name)} returned a non-JSON result: ${err.message}`);
    }
  }

  /** A unary RPC: look up, decode (malformed: INVALID_ARGUMENT), call, encode. */
  unary(hook, codec, decoder, typeName) {
    return (call, callback) => {
      const controller = new AbortController();
      const cancel = () => controller.abort(new Error('the call was cancelled'));
      call.on('cancelled', cancel);
      const deadline = deadlineOf(call);
      noteDeadline(controller.signal, deadline); // the hook's `model` calls carry what is left
      const timer = Number.isFinite(deadline)
        ? setTimeout(() => controller.abort(new Error('the deadline passed')), Math.max(0, deadline - Date.now()))
        : null;
      (async () => {
        const req = decode(decoder, call.request, hook, this.rejects, typeName);
        const fused = (req.context && req.context.fused) || [];
        if (fused.length && hook === 'executeTool') throw new InvalidInputError('ExecuteTool runs one tool: context.fused must be empty');
        if (hook === 'executeTool' && !(req.context && req.context.processor_id)) {
          const tool = this.lookupTool(req.tool_name);
          const run = () => this.callTool(req, controller.signal, tool);
          return tracing.hookSpan(hook, '', call.metadata, (span) => traced(span, run, (resp) => (resp.error ? 'error' : 'ok')), { tool: tool.name });
        }
        const hosted = this.lookup(req.context, hook);
        const one = (h, member = null) => {
          const run = () => this.serveHook(h, hook, codec, req, controller.signal, member);
          return tracing.hookSpan(hook, h.id, call.metadata, (span) => traced(span, run, tracing.outcomeOf));
        };
        if (fused.length) return runFused(one, hosted, this.lookupFused(req.context, hook), fused);
        return one(hosted);
      })().then(
        (resp) => callback(null, resp),
        (err) => callback(toStatus(err)),
      ).finally(() => {
        if (timer) clearTimeout(timer);
        call.removeListener('cancelled', cancel);
      });
    };
  }

  /** One unary hook call of `hosted`: base arguments, the codec's decode, the hook, encode. */
  async serveHook(hosted, hook, codec, req, signal, member = null) {
    const effects = new HookEffects(hosted.id);
    const args = this.baseArgs(hosted, req.context, effects, signal, member);
    let extra;
    try {
      extra = codec.decode(req, args);
    } catch (err) {
      this.rejects.note(hook, (err && err.name) || typeof err, err && err.message);
      throw new InvalidInputError(`malformed ${hook} request: ${err && err.message ? err.message : String(err)}`);
    }
    Object.assign(args, extra.args);
    let result;
    try {
      result = await this.callHook(hosted, hook, args, effects);
    } catch (err) {
      if (err instanceof ToolRaised) return { error: err.message }; // its effects and state are dropped
      throw err;
    }
    const resp = effects.abort ? {} : codec.encode(result, extra, args);
    resp.effects = fillEffects(effects, args.state);
    return resp;
  }

  /**
   * The ProcessorService implementation: Describe, then one handler per hook of the table.
   * `decoders` (per RPC; ./guard rawService) decode the requests, which arrive as Buffers.
   */
  handlers(decoders) {
    const typeName = (rpc) => `procmesh.v1.${rpc}Request`;
    const h = {
      Describe: (call, callback) => {
        try {
          decode(decoders.Describe, call.request, 'Describe', this.rejects, typeName('Describe'));
        } catch (err) {
          callback(toStatus(err));
          return;
        }
        callback(null, {
          processors: [...this.hosted.values()].map((x) => x.info()),
          sdk: `procmesh-node/${version}`,
          tools: [...this.tools.values()].map((t) => t.info()),
          fuses: true,
        });
      },
    };
    for (const hook of HOOKS) {
      const decoder = decoders[hook.rpc];
      h[hook.rpc] = hook.streaming
        ? (call) => outputStream(this, hook.name, call, (buf) => decode(decoder, buf, hook.name, this.rejects, typeName(hook.rpc)))
        : this.unary(hook.name, CODECS[hook.name], decoder, typeName(hook.rpc));
    }
    return h;
  }
}

/** Where a tool call's suspension record sits on its context (`suspensionOf`): hidden from the
 * tool, read by the metered servicer to count the call `suspended`, as the Python SDK does. */
const SUSPENSION = Symbol('procmesh.suspension');

/**
 * A hosted tool's suspension (the reference's suspend(payload)): `ctx.suspend` (also `ctx.agent.suspend`)
 * records the payload; a resumed call's `ctx.resumeData` / `ctx.suspendPayload` (also under
 * `ctx.agent`, where the reference's tools read them) come from the request. Returns the record.
 */
function suspensionOf(req, ctx) {
  const record = { asked: false, payload: null };
  ctx[SUSPENSION] = record;
  const resumed = req.resume_data !== undefined && req.resume_data !== null;
  ctx.resumed = resumed;
  ctx.resumeData = resumed ? convert.fromValue(req.resume_data) : undefined;
  ctx.suspendPayload = resumed && req.suspend_payload ? convert.fromValue(req.suspend_payload) : undefined;
  ctx.suspend = async (payload) => {
    record.asked = true;
    record.payload = payload === undefined ? null : payload;
  };
  ctx.agent = {
    toolCallId: ctx.toolCallId,
    suspend: ctx.suspend,
    resumeData: ctx.resumeData,
    suspendPayload: ctx.suspendPayload,
  };
  return record;
}

/** The answer of a tool that suspended: the payload, the tool's resumeSchema (JSON text), its chunks. */
function suspendedAnswer(tool, suspension, ctx) {
  const answer = {};
  try {
    answer.suspend_payload = convert.toValue(suspension.payload);
  } catch (err) {
    throw new InternalError(`tool ${quote(tool.name)} suspended with a non-JSON payload: ${err.message}`);
  }
  if (tool.tool.resumeSchema !== undefined) answer.resume_schema = JSON.stringify(tool.tool.resumeSchema);
  if (ctx.writer.chunks.length) answer.effects = { custom_chunks: ctx.writer.chunks.map(convert.chunkToProto) };
  return answer;
}

module.exports = { Hosted, Servicer, SUSPENSION };
