'use strict';
// ProcessorServer: hosts processors over gRPC (TCP and unix sockets) with grpc.health.v1.
// The twin of the Python SDK's procmesh/_server.py: same RPC semantics, status codes and
// response shapes; see proto/README.md for the contract.

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

const convert = require('./convert');
const { InternalError, InvalidInputError, NotFoundError, NotReadyError, ProcmeshError, UnimplementedError } = require('./errors');
const { HOOKS, HookEffects, MessageList, RequestContext, TripWire, Writer } = require('./processor');
const { validate } = require('./options');
const { version } = require('../package.json');

const SERVICE_NAME = 'procmesh.v1.ProcessorService';
const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
const ENUM_OF = Object.fromEntries(HOOKS.map(([name, , enumName]) => [name, enumName]));

// -- the contract ------------------------------------------------------------------------------

/**
 * Where procmesh/v1/*.proto is read from: $PROCMESH_PROTO_DIR, else the copy a packed package
 * carries (./proto, made by `npm pack`), else the repository's proto/ (this package lives in
 * sdk/node of the procmesh repository, so the contract has one source of truth there).
 */
function protoDir() {
  const candidates = [process.env.PROCMESH_PROTO_DIR, path.join(__dirname, '..', 'proto'), path.join(__dirname, '..', '..', '..', 'proto')];
  for (const dir of candidates) {
    if (dir && fs.existsSync(path.join(dir, 'procmesh', 'v1', 'processor.proto'))) return dir;
  }
  throw new Error(`procmesh/v1/processor.proto not found in ${candidates.filter(Boolean).join(', ')} (set PROCMESH_PROTO_DIR)`);
}

/** The loader options: snake_case fields, enum names, oneof names, no implicit defaults (presence matters). */
const LOADER_OPTIONS = { keepCase: true, enums: String, longs: Number, defaults: false, oneofs: true, arrays: true };

let cachedPackage = null;
/** The loaded procmesh.v1 package (`.ProcessorService`, message types) for @grpc/grpc-js. */
function loadContract() {
  if (cachedPackage === null) {
    const def = protoLoader.loadSync('procmesh/v1/processor.proto', { ...LOADER_OPTIONS, includeDirs: [protoDir()] });
    cachedPackage = grpc.loadPackageDefinition(def).procmesh.v1;
  }
  return cachedPackage;
}

// -- logging -----------------------------------------------------------------------------------

const LEVELS = { DEBUG: 10, INFO: 20, WARNING: 30, WARN: 30, ERROR: 40, CRITICAL: 50 };

function makeLogger(level) {
  const min = LEVELS[String(level || 'INFO').toUpperCase()] ?? 20;
  const emit = (name, args) => {
    if (LEVELS[name] >= min) console.error(new Date().toISOString(), name, 'procmesh:', ...args);
  };
  return {
    debug: (...a) => emit('DEBUG', a),
    info: (...a) => emit('INFO', a),
    warn: (...a) => emit('WARNING', a),
    error: (...a) => emit('ERROR', a),
  };
}

// -- hosted processors -------------------------------------------------------------------------

function plainObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof MessageList);
}

function quote(text) {
  return `'${String(text)}'`;
}

class Hosted {
  constructor(processor) {
    if (!processor || typeof processor !== 'object') throw new TypeError(`a processor must be an object, got ${convert.describe(processor)}`);
    const cls = (processor.constructor && processor.constructor.name) || 'processor';
    if (typeof processor.id !== 'string' || !processor.id) throw new TypeError(`${cls} has no id (a non-empty string)`);
    this.processor = processor;
    this.id = processor.id;
    this.hooks = new Set(HOOKS.map(([name]) => name).filter((name) => typeof processor[name] === 'function'));
    const schema = processor.optionsSchema;
    if (schema !== undefined && schema !== null && (typeof schema !== 'object' || Array.isArray(schema))) {
      throw new TypeError(`processor ${quote(this.id)}: optionsSchema must be a JSON schema object`);
    }
    this.schema = schema || null;
  }

  info() {
    const p = this.processor;
    return {
      id: this.id,
      name: p.name || this.id,
      description: p.description || '',
      hooks: HOOKS.filter(([name]) => this.hooks.has(name)).map(([, , enumName]) => enumName),
      process_data_parts: Boolean(p.processDataParts),
      options_schema_json: this.schema ? JSON.stringify(this.schema) : '',
    };
  }

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

// -- request decoding and response encoding ------------------------------------------------------

function decodeMessages(list) {
  return (list || []).map(convert.messageFromProto);
}

function fillMessages(messages, hook) {
  if (messages instanceof MessageList) messages = messages.getAll();
  if (!Array.isArray(messages)) throw new InternalError(`${hook} returned messages of type ${convert.describe(messages)}; expected an array`);
  return messages.map((msg) => {
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) {
      throw new InternalError(`${hook} returned a message of type ${convert.describe(msg)}; expected an object`);
    }
    try {
      return convert.messageToProto(msg);
    } catch (err) {
      throw new InternalError(`${hook} returned a malformed message: ${err.message}`);
    }
  });
}

function fillEffects(effects, state) {
  // Everything here came from the hook (state included): a conversion failure is the
  // processor's fault (INTERNAL), not a malformed request (INVALID_ARGUMENT).
  try {
    const out = {
      signals: effects.signals.map(convert.signalToProto),
      custom_chunks: effects.customChunks.map(convert.chunkToProto),
      violations: effects.violations.map(([message, detail]) => {
        const v = { message };
        if (detail !== undefined && detail !== null) v.detail = convert.toValue(detail);
        return v;
      }),
    };
    if (effects.abort) {
      out.abort = convert.abortToProto({ reason: effects.abort.reason, retry: effects.abort.retry, metadata: effects.abort.metadata });
    }
    if (state !== undefined) out.state = convert.toStruct(state);
    return out;
  } catch (err) {
    throw new InternalError(`processor ${quote(effects.processorId)} left effects or state that cannot be sent: ${err.message}`);
  }
}

/** Array-style return (or in-place messageList edits) of processOutputStep / processOutputResult. */
function fillReplacement(resp, result, messageList, hook) {
  if ((Array.isArray(result) || result instanceof MessageList) && result !== messageList) {
    if (Array.isArray(result) && result.length === 0) return; // the seeds' examples return [] for "no change"
    resp.replace_messages = true;
    resp.messages = fillMessages(result, hook);
  } else if (messageList.modified) {
    resp.replace_messages = true;
    resp.messages = fillMessages(messageList, hook);
  } else if (result !== undefined && result !== null && result !== messageList) {
    throw new InternalError(`${hook} returned ${convert.describe(result)}; expected an array of messages or nothing`);
  }
}

const STEP_KEYS = new Set(['messages', 'messageList', 'systemMessages', 'model', 'tools', 'toolChoice', 'activeTools', 'providerOptions', 'modelSettings']);

function fillStepOverrides(resp, result, messageList) {
  const unknown = Object.keys(result).filter((k) => !STEP_KEYS.has(k)).sort();
  if (unknown.length) throw new InternalError(`processInputStep returned unknown keys ${JSON.stringify(unknown)}`);
  const hook = 'processInputStep';
  if ('messageList' in result && result.messageList !== messageList) {
    throw new InternalError('processInputStep returned a messageList that is not the one it was given');
  }
  if ('messages' in result) {
    resp.replace_messages = true;
    resp.messages = fillMessages(result.messages, hook);
  }
  if ('systemMessages' in result) {
    resp.replace_system_messages = true;
    resp.system_messages = fillMessages(result.systemMessages, hook);
  }
  if (result.model !== undefined && result.model !== null && result.model !== '') {
    if (typeof result.model !== 'string') {
      throw new InternalError(`processInputStep returned a model of type ${convert.describe(result.model)}; expected a models key or 'provider/model-id'`);
    }
    resp.model = result.model;
  }
  try {
    if ('tools' in result) {
      const tools = plainObject(result.tools)
        ? Object.entries(result.tools).map(([name, t]) => ({ name, ...(t || {}) }))
        : result.tools;
      if (!Array.isArray(tools)) throw new TypeError(`tools must be an array, got ${convert.describe(tools)}`);
      resp.replace_tools = true;
      resp.tools = tools.map(convert.toolToProto);
    }
    if (result.providerOptions && Object.keys(result.providerOptions).length) resp.provider_options = convert.toStruct(result.providerOptions);
    if (result.modelSettings && Object.keys(result.modelSettings).length) resp.model_settings = convert.toStruct(result.modelSettings);
  } catch (err) {
    if (err instanceof ProcmeshError) throw err;
    throw new InternalError(`processInputStep returned malformed step overrides: ${err.message}`);
  }
  const choice = result.toolChoice;
  if (typeof choice === 'string') {
    if (!['auto', 'none', 'required'].includes(choice)) throw new InternalError(`processInputStep returned toolChoice ${JSON.stringify(choice)}`);
    resp.tool_choice = { mode: choice };
  } else if (plainObject(choice)) {
    resp.tool_choice = { mode: 'tool', tool_name: String(choice.toolName || '') };
  }
  if ('activeTools' in result) {
    if (!Array.isArray(result.activeTools)) throw new InternalError('processInputStep returned activeTools that is not an array');
    resp.replace_active_tools = true;
    resp.active_tools = result.activeTools.map(String);
  }
}

function apiErrorFromProto(err) {
  const e = err || {};
  const error = {
    status: e.status || 0,
    message: e.message || '',
    body: e.body || '',
    retryable: Boolean(e.retryable),
    id: e.id || undefined,
    details: convert.fromStruct(e.details),
  };
  // The reference engine hands hooks an APICallError; its field names read the same values.
  Object.defineProperties(error, {
    statusCode: { get: () => error.status, enumerable: false },
    isRetryable: { get: () => error.retryable, enumerable: false },
    responseBody: { get: () => error.body, enumerable: false },
  });
  return error;
}

function toStatus(err) {
  if (err instanceof ProcmeshError) return { code: err.code, details: err.message };
  return { code: grpc.status.INTERNAL, details: `unexpected error: ${err && err.stack ? err.stack : String(err)}` };
}

function deadlineOf(call) {
  const deadline = call.getDeadline ? call.getDeadline() : Infinity;
  return deadline instanceof Date ? deadline.getTime() : Number(deadline);
}

// -- the servicer --------------------------------------------------------------------------------

class Servicer {
  constructor(hosted, log) {
    this.hosted = hosted;
    this.log = log;
    /** Hooks are served only once every processor's setup() resolved. */
    this.ready = false;
  }

  lookup(ctx, hook) {
    if (!this.ready) throw new NotReadyError('the sidecar is starting or draining; retry when health reports SERVING');
    const id = ctx && ctx.processor_id;
    if (!id) throw new InvalidInputError('request.context.processor_id is required');
    const hosted = this.hosted.get(id);
    if (!hosted) {
      throw new NotFoundError(`processor ${quote(id)} is not hosted here (hosted: ${JSON.stringify([...this.hosted.keys()].sort())})`);
    }
    if (!hosted.hooks.has(hook)) throw new UnimplementedError(`processor ${quote(hosted.id)} does not implement ${hook}`);
    return hosted;
  }

  baseArgs(hosted, ctx, effects, signal) {
    return {
      abort: effects.abortHook,
      state: convert.fromStruct(ctx.state),
      options: hosted.options(ctx.options),
      retryCount: ctx.retry_count || 0,
      stepNumber: ctx.step_number || 0,
      runId: ctx.run_id || '',
      agentId: ctx.agent_id || '',
      threadId: ctx.thread_id || undefined,
      resourceId: ctx.resource_id || undefined,
      requestContext: new RequestContext(convert.fromStruct(ctx.request_context)),
      sendSignal: effects.sendSignal,
      writer: new Writer(effects),
      reportViolation: effects.reportViolation,
      abortSignal: signal,
    };
  }

  /** Run one hook; a TripWire becomes the abort effect, anything else it throws is INTERNAL. */
  async callHook(hosted, hook, args, effects) {
    try {
      return await hosted.processor[hook](args);
    } catch (err) {
      if (err instanceof TripWire) {
        effects.abort = err;
        return undefined;
      }
      if (err instanceof ProcmeshError) throw err;
      const kind = (err && err.name) || typeof err;
      const message = err && err.message !== undefined ? err.message : String(err);
      this.log.error(`processor ${hosted.id} hook ${hook} raised`, err && err.stack ? err.stack : err);
      throw new InternalError(`processor ${quote(hosted.id)} hook ${hook} raised ${kind}: ${message}`);
    }
  }

  /** A unary RPC: look up, decode (malformed: INVALID_ARGUMENT), call, encode. */
  unary(hook, build) {
    return (call, callback) => {
      const controller = new AbortController();
      const cancel = () => controller.abort(new Error('the call was cancelled'));
      call.on('cancelled', cancel);
      const deadline = deadlineOf(call);
      const timer = Number.isFinite(deadline)
        ? setTimeout(() => controller.abort(new Error('the deadline passed')), Math.max(0, deadline - Date.now()))
        : null;
      (async () => {
        const req = call.request;
        const hosted = this.lookup(req.context, hook);
        const effects = new HookEffects(hosted.id);
        const args = this.baseArgs(hosted, req.context, effects, controller.signal);
        let extra;
        try {
          extra = build.decode(req, args);
        } catch (err) {
          throw new InvalidInputError(`malformed ${hook} request: ${err && err.message ? err.message : String(err)}`);
        }
        Object.assign(args, extra.args);
        const result = await this.callHook(hosted, hook, args, effects);
        const resp = effects.abort ? {} : build.encode(result, extra, args);
        resp.effects = fillEffects(effects, args.state);
        return resp;
      })().then(
        (resp) => callback(null, resp),
        (err) => callback(toStatus(err)),
      ).finally(() => {
        if (timer) clearTimeout(timer);
        call.removeListener('cancelled', cancel);
      });
    };
  }

  handlers() {
    const h = {};
    h.Describe = (call, callback) => {
      callback(null, { processors: [...this.hosted.values()].map((x) => x.info()), sdk: `procmesh-node/${version}` });
    };

    h.ProcessInput = this.unary('processInput', {
      decode(req) {
        const messageList = new MessageList(decodeMessages(req.all_messages));
        return { messageList, args: { messages: decodeMessages(req.messages), messageList, systemMessages: decodeMessages(req.system_messages) } };
      },
      encode(result, { messageList }) {
        const resp = {};
        const hook = 'processInput';
        if (messageList.modified) {
          resp.replace_all_messages = true;
          resp.all_messages = fillMessages(messageList, hook);
        }
        if (Array.isArray(result)) {
          resp.replace_messages = true;
          resp.messages = fillMessages(result, hook);
        } else if (plainObject(result)) {
          if ('messages' in result) {
            resp.replace_messages = true;
            resp.messages = fillMessages(result.messages, hook);
          }
          if ('systemMessages' in result) {
            resp.replace_system_messages = true;
            resp.system_messages = fillMessages(result.systemMessages, hook);
          }
        } else if (result !== undefined && result !== null && result !== messageList) {
          throw new InternalError(`processInput returned ${convert.describe(result)}; expected an array of messages, { messages, systemMessages }, the messageList or nothing`);
        }
        return resp;
      },
    });

    h.ProcessInputStep = this.unary('processInputStep', {
      decode(req) {
        const messages = decodeMessages(req.messages);
        const messageList = new MessageList(messages);
        const tc = req.tool_choice || {};
        let toolChoice = tc.mode || undefined;
        if (tc.mode === 'tool') toolChoice = { type: 'tool', toolName: tc.tool_name || '' };
        return {
          messageList,
          args: {
            messages,
            messageList,
            systemMessages: decodeMessages(req.system_messages),
            model: req.model || '',
            tools: (req.tools || []).map(convert.toolFromProto),
            toolChoice,
            activeTools: [...(req.active_tools || [])],
            providerOptions: convert.fromStruct(req.provider_options),
            modelSettings: convert.fromStruct(req.model_settings),
            steps: (req.steps || []).map(convert.stepFromProto),
          },
        };
      },
      encode(result, { messageList }) {
        const resp = {};
        const hook = 'processInputStep';
        if (messageList.modified) {
          resp.replace_messages = true;
          resp.messages = fillMessages(messageList, hook);
        }
        if ((Array.isArray(result) || result instanceof MessageList) && result !== messageList) {
          resp.replace_messages = true;
          resp.messages = fillMessages(result, hook);
        } else if (plainObject(result)) {
          fillStepOverrides(resp, result, messageList);
        } else if (result !== undefined && result !== null && result !== messageList) {
          throw new InternalError(`processInputStep returned ${convert.describe(result)}; expected an object of step overrides, an array of messages, the messageList or nothing`);
        }
        return resp;
      },
    });

    h.ProcessLLMRequest = this.unary('processLLMRequest', {
      decode(req) {
        return { args: { prompt: convert.promptFromProto(req.prompt), model: req.model || '', steps: (req.steps || []).map(convert.stepFromProto) } };
      },
      encode(result) {
        const resp = {};
        if (result === undefined || result === null) return resp;
        if (!plainObject(result)) {
          throw new InternalError(`processLLMRequest returned ${convert.describe(result)}; expected { prompt } and/or { response: [chunks] } or nothing`);
        }
        try {
          if ('prompt' in result) {
            resp.replace_prompt = true;
            resp.prompt = convert.promptToProto(result.prompt);
          }
          if (result.response !== undefined && result.response !== null) {
            if (!Array.isArray(result.response)) throw new TypeError('response must be an array of chunks');
            resp.has_cached_response = true;
            resp.cached_response = result.response.map(convert.chunkToProto);
          }
        } catch (err) {
          throw new InternalError(`processLLMRequest returned a malformed value: ${err.message}`);
        }
        return resp;
      },
    });

    h.ProcessLLMResponse = this.unary('processLLMResponse', {
      decode(req) {
        return {
          args: {
            chunks: (req.chunks || []).map(convert.chunkFromProto),
            model: req.model || '',
            steps: (req.steps || []).map(convert.stepFromProto),
            fromCache: Boolean(req.from_cache),
          },
        };
      },
      encode() {
        return {};
      },
    });

    h.ProcessOutputStep = this.unary('processOutputStep', {
      decode(req) {
        const messages = decodeMessages(req.messages);
        const messageList = new MessageList(messages);
        const toolCalls = (req.tool_calls || []).map(convert.toolCallFromProto);
        return {
          messageList,
          args: {
            messages,
            messageList,
            systemMessages: decodeMessages(req.system_messages),
            text: req.text || '',
            toolCalls: toolCalls.length ? toolCalls : undefined,
            finishReason: req.finish_reason || '',
            usage: convert.usageFromProto(req.usage),
            steps: (req.steps || []).map(convert.stepFromProto),
          },
        };
      },
      encode(result, { messageList }) {
        const resp = {};
        fillReplacement(resp, result, messageList, 'processOutputStep');
        return resp;
      },
    });

    h.ProcessToolResult = this.unary('processToolResult', {
      decode(req) {
        return {
          args: {
            messages: decodeMessages(req.messages),
            toolName: req.tool_name || '',
            toolCallId: req.tool_call_id || '',
            args: convert.fromValue(req.args),
            result: convert.fromValue(req.result),
            providerExecuted: Boolean(req.provider_executed),
            steps: (req.steps || []).map(convert.stepFromProto),
          },
        };
      },
      encode(result) {
        const resp = {};
        if (result !== undefined && result !== null) {
          resp.replace_result = true;
          try {
            resp.result = convert.toValue(result);
          } catch (err) {
            throw new InternalError(`processToolResult returned a non-JSON result: ${err.message}`);
          }
        }
        return resp;
      },
    });

    h.ProcessOutputResult = this.unary('processOutputResult', {
      decode(req) {
        const messages = decodeMessages(req.messages);
        const messageList = new MessageList(messages);
        const res = req.result || {};
        return {
          messageList,
          args: {
            messages,
            messageList,
            result: {
              text: res.text || '',
              usage: convert.usageFromProto(res.usage),
              finishReason: res.finish_reason || '',
              steps: (res.steps || []).map(convert.stepFromProto),
            },
          },
        };
      },
      encode(result, { messageList }) {
        const resp = {};
        fillReplacement(resp, result, messageList, 'processOutputResult');
        return resp;
      },
    });

    h.ProcessAPIError = this.unary('processAPIError', {
      decode(req) {
        const messages = decodeMessages(req.messages);
        const messageList = new MessageList(messages);
        return {
          messageList,
          args: { error: apiErrorFromProto(req.error), messages, messageList, steps: (req.steps || []).map(convert.stepFromProto) },
        };
      },
      encode(result, { messageList }) {
        const resp = {};
        if (messageList.modified) {
          resp.replace_messages = true;
          resp.messages = fillMessages(messageList, 'processAPIError');
        }
        if (plainObject(result)) resp.retry = Boolean(result.retry);
        else if (result !== undefined && result !== null) {
          throw new InternalError(`processAPIError returned ${convert.describe(result)}; expected { retry: boolean } or nothing`);
        }
        return resp;
      },
    });

    h.ExecuteTool = this.unary('executeTool', {
      decode(req) {
        return {
          args: {
            toolName: req.tool_name || '',
            toolCallId: req.tool_call_id || '',
            args: convert.fromValue(req.args),
            messages: decodeMessages(req.messages),
          },
        };
      },
      encode(result) {
        try {
          return { result: convert.toValue(result === undefined ? null : result) };
        } catch (err) {
          throw new InternalError(`executeTool returned a non-JSON result: ${err.message}`);
        }
      },
    });

    h.ProcessOutputStream = (call) => this.outputStream(call);
    return h;
  }

  /**
   * ProcessOutputStream: batches are handled strictly in order; each part gets one result (seq
   * echoed, part absent = drop); after an abort or the client's half-close, StreamEnd{state}.
   */
  outputStream(call) {
    const hook = 'processOutputStream';
    const controller = new AbortController();
    let hosted = null;
    let base = null;
    const streamParts = [];
    let finished = false;
    let chain = Promise.resolve();

    const fail = (err) => {
      if (finished) return;
      finished = true;
      call.emit('error', toStatus(err));
    };
    const finish = () => {
      if (finished) return;
      let state;
      try {
        state = convert.toStruct(base ? base.state : undefined);
      } catch (err) {
        throw new InternalError(`processor ${quote(hosted.id)} left a state that cannot be sent: ${err.message}`);
      }
      finished = true;
      call.write({ end: { state } });
      call.end();
    };
    const handle = async (req) => {
      if (finished) return;
      if (hosted === null) {
        hosted = this.lookup(req.context, hook);
        base = this.baseArgs(hosted, req.context, new HookEffects(hosted.id), controller.signal);
        base.streamParts = streamParts;
      }
      const results = [];
      let aborted = false;
      for (const item of req.parts || []) {
        const seq = item.seq || 0;
        if (!item.part || !item.part.type) throw new InvalidInputError(`malformed ${hook} request: stream part ${seq} has no chunk type`);
        const result = { seq };
        const part = convert.chunkFromProto(item.part);
        if (part.type.startsWith('data-') && !hosted.processor.processDataParts) {
          result.part = item.part; // passed through untouched
          results.push(result);
          continue;
        }
        streamParts.push(part);
        const effects = new HookEffects(hosted.id);
        const args = {
          ...base,
          part,
          abort: effects.abortHook,
          sendSignal: effects.sendSignal,
          writer: new Writer(effects),
          reportViolation: effects.reportViolation,
        };
        const out = await this.callHook(hosted, hook, args, effects);
        if (finished) return; // cancelled meanwhile
        if (!effects.abort && out !== undefined && out !== null) {
          // an array turns one part into several (empty: dropped)
          const parts = Array.isArray(out) ? out : [out];
          parts.forEach((chunk, i) => {
            if (!plainObject(chunk) || typeof chunk.type !== 'string') {
              throw new InternalError(`${hook} returned ${convert.describe(chunk)}; expected a chunk object, an array of them, or nothing`);
            }
            let encoded;
            try {
              encoded = convert.chunkToProto(chunk);
            } catch (err) {
              throw new InternalError(`${hook} returned a malformed chunk: ${err.message}`);
            }
            if (i === 0) result.part = encoded;
            else (result.extra_parts = result.extra_parts || []).push(encoded);
          });
        }
        const fx = fillEffects(effects, undefined);
        if (fx.abort || fx.signals.length || fx.custom_chunks.length || fx.violations.length) result.effects = fx;
        results.push(result);
        if (effects.abort) {
          aborted = true;
          break;
        }
      }
      if (!finished) call.write({ results });
      if (aborted) finish();
    };

    call.on('data', (req) => {
      chain = chain.then(() => handle(req)).catch(fail);
    });
    call.on('end', () => {
      chain = chain.then(finish).catch(fail);
    });
    call.on('cancelled', () => {
      finished = true;
      controller.abort(new Error('the call was cancelled'));
    });
    call.on('error', () => {}); // the status is sent by grpc-js; nothing else to do
  }
}

// -- the server ----------------------------------------------------------------------------------

function unixPath(address) {
  return address.startsWith('unix://') ? address.slice('unix://'.length) : address.slice('unix:'.length);
}

function bind(server, address, credentials) {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, credentials, (err, port) => (err ? reject(err) : resolve(port)));
  });
}

/**
 * A gRPC server hosting one or more processors, with grpc.health.v1.
 *
 * `addresses`: `host:port` (port 0 picks a free port) or `unix:///path.sock`; `start()` fills
 * `this.addresses` with the bound ones.
 */
class ProcessorServer {
  constructor(processors, options = {}) {
    const hosted = new Map();
    for (const proc of processors || []) {
      const entry = new Hosted(proc);
      if (hosted.has(entry.id)) throw new TypeError(`two processors share the id ${quote(entry.id)}`);
      if (!entry.hooks.size) throw new TypeError(`processor ${quote(entry.id)} implements no hook`);
      hosted.set(entry.id, entry);
    }
    if (!hosted.size) throw new TypeError('a ProcessorServer needs at least one processor');
    this._hosted = hosted;
    this._requested = options.addresses || (options.address ? [options.address] : ['127.0.0.1:0']);
    this._credentials = options.credentials || grpc.ServerCredentials.createInsecure();
    this._maxBytes = options.maxMessageBytes || DEFAULT_MAX_MESSAGE_BYTES;
    this.log = options.logger || makeLogger(options.logLevel);
    this._server = null;
    this._health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE_NAME]: 'NOT_SERVING' });
    this.addresses = [];
  }

  /** The ids of the hosted processors. */
  get processorIds() {
    return [...this._hosted.keys()];
  }

  /** Bind the addresses (Describe answers at once), run every setup(), then report SERVING. */
  async start() {
    const server = new grpc.Server({
      'grpc.max_receive_message_length': this._maxBytes,
      'grpc.max_send_message_length': this._maxBytes,
    });
    this._servicer = new Servicer(this._hosted, this.log);
    server.addService(loadContract().ProcessorService.service, this._servicer.handlers());
    this._health.addToServer(server);
    this._server = server;
    try {
      for (const address of this._requested) {
        if (address.startsWith('unix:')) {
          const file = unixPath(address);
          fs.mkdirSync(path.dirname(file) || '.', { recursive: true });
          fs.rmSync(file, { force: true }); // a stale socket from a previous run
          await bind(server, address, this._credentials);
          fs.chmodSync(file, 0o660);
          this.addresses.push(address);
        } else {
          const port = await bind(server, address, this._credentials);
          this.addresses.push(`${address.slice(0, address.lastIndexOf(':'))}:${port}`);
        }
      }
      for (const entry of this._hosted.values()) {
        if (typeof entry.processor.setup === 'function') await entry.processor.setup();
      }
    } catch (err) {
      await this.stop(0); // a failed start leaves nothing bound
      throw err;
    }
    this._servicer.ready = true;
    this._health.setStatus('', 'SERVING');
    this._health.setStatus(SERVICE_NAME, 'SERVING');
    this.log.info(`serving processors ${JSON.stringify(this.processorIds)} on ${this.addresses.join(', ')}`);
    return this;
  }

  /** Report NOT_SERVING, let in-flight calls finish within `graceSeconds`, then tear down. */
  async stop(graceSeconds = 5) {
    const server = this._server;
    if (server === null) return;
    this._server = null;
    this._health.setStatus('', 'NOT_SERVING');
    this._health.setStatus(SERVICE_NAME, 'NOT_SERVING');
    await new Promise((resolve) => {
      const timer = setTimeout(() => {
        server.forceShutdown();
        resolve();
      }, Math.max(0, graceSeconds) * 1000);
      server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    if (this._servicer) this._servicer.ready = false;
    for (const entry of this._hosted.values()) {
      try {
        if (typeof entry.processor.teardown === 'function') await entry.processor.teardown();
      } catch (err) {
        this.log.error(`teardown of ${entry.id} failed`, err);
      }
    }
    for (const address of this.addresses) {
      if (address.startsWith('unix:')) fs.rmSync(unixPath(address), { force: true });
    }
  }
}

// -- serve / run -------------------------------------------------------------------------------------

/**
 * Settings from the environment (PROCMESH_LISTEN, PROCMESH_GRACE_SECONDS, PROCMESH_LOG_LEVEL,
 * PROCMESH_PARENT_PID, PROCMESH_TLS_*), overridden by flags (--listen ADDR, repeatable;
 * --grace-seconds S; --log-level L; --parent-pid N; --tls-cert/--tls-key/--tls-client-ca).
 * Unknown flags are left alone.
 */
function settingsFromArgs(argv = process.argv.slice(2), env = process.env) {
  const settings = { addresses: ['127.0.0.1:50051'], graceSeconds: 10, logLevel: 'INFO' };
  if (env.PROCMESH_LISTEN) {
    const raw = env.PROCMESH_LISTEN.trim();
    settings.addresses = raw.startsWith('[') ? JSON.parse(raw) : [raw];
  }
  if (env.PROCMESH_GRACE_SECONDS) settings.graceSeconds = Number(env.PROCMESH_GRACE_SECONDS);
  if (env.PROCMESH_LOG_LEVEL) settings.logLevel = env.PROCMESH_LOG_LEVEL;
  if (env.PROCMESH_PARENT_PID) settings.parentPid = Number(env.PROCMESH_PARENT_PID);
  for (const [key, name] of [['tlsCert', 'PROCMESH_TLS_CERT'], ['tlsKey', 'PROCMESH_TLS_KEY'], ['tlsClientCa', 'PROCMESH_TLS_CLIENT_CA']]) {
    if (env[name]) settings[key] = env[name];
  }
  const listen = [];
  const flags = {
    '--listen': (v) => listen.push(v),
    '--grace-seconds': (v) => (settings.graceSeconds = Number(v)),
    '--log-level': (v) => (settings.logLevel = v),
    '--parent-pid': (v) => (settings.parentPid = Number(v)),
    '--tls-cert': (v) => (settings.tlsCert = v),
    '--tls-key': (v) => (settings.tlsKey = v),
    '--tls-client-ca': (v) => (settings.tlsClientCa = v),
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    if (!(name in flags)) continue;
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) throw new Error(`${name} needs a value`);
    flags[name](value);
  }
  if (listen.length) settings.addresses = listen;
  return settings;
}

function tlsCredentials({ tlsCert, tlsKey, tlsClientCa }) {
  if (!tlsCert && !tlsKey) return undefined;
  if (!(tlsCert && tlsKey)) throw new Error('TLS needs both --tls-cert and --tls-key');
  const ca = tlsClientCa ? fs.readFileSync(tlsClientCa) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ private_key: fs.readFileSync(tlsKey), cert_chain: fs.readFileSync(tlsCert) }], Boolean(ca));
}

/**
 * Start a ProcessorServer for `processors` and return it once SERVING.
 *
 * Options: `address` or `addresses` (default: --listen / PROCMESH_LISTEN / 127.0.0.1:50051),
 * `graceSeconds`, `logLevel`, `parentPid` (stop when that parent is gone), `credentials`,
 * `maxMessageBytes`, `handleSignals` (default true: SIGTERM/SIGINT drain within the grace
 * period, then the process exits).
 */
async function serve(processors, options = {}) {
  const settings = settingsFromArgs();
  const opts = { ...settings, ...options };
  if (options.address) opts.addresses = [options.address];
  if (!opts.credentials) opts.credentials = tlsCredentials(opts);
  const server = new ProcessorServer(processors, opts);
  await server.start();
  const grace = opts.graceSeconds ?? 10;
  let stopping = null;
  const shutdown = (why) => {
    if (stopping) return stopping;
    server.log.info(`${why}; stopping (grace ${grace}s)`);
    stopping = server.stop(grace).then(() => {
      if (opts.handleSignals !== false) process.exit(0);
    });
    return stopping;
  };
  if (opts.handleSignals !== false) {
    for (const sig of ['SIGTERM', 'SIGINT']) process.once(sig, () => shutdown(sig));
  }
  if (opts.parentPid) {
    const watch = setInterval(() => {
      if (process.ppid !== opts.parentPid) {
        clearInterval(watch);
        shutdown(`parent process ${opts.parentPid} is gone`);
      }
    }, 500);
    watch.unref();
  }
  return server;
}

/** Serve until SIGTERM/SIGINT with every setting from the command line and environment (procmesh.run). */
function run(processors, overrides = {}) {
  return serve(processors, overrides).catch((err) => {
    console.error('procmesh: error:', err && err.stack ? err.stack : err);
    process.exit(1);
  });
}

module.exports = { DEFAULT_MAX_MESSAGE_BYTES, LOADER_OPTIONS, ProcessorServer, SERVICE_NAME, loadContract, protoDir, run, serve, settingsFromArgs };
