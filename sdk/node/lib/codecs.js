'use strict';
// How each unary hook's request becomes the hook's arguments (decode) and what it returns becomes
// its response (encode), keyed by the hook table's names (./hooks). A malformed request fails in
// decode (INVALID_ARGUMENT), a malformed return value in encode (INTERNAL).

const convert = require('./convert');
const { InternalError, ProcmeshError } = require('./errors');
const { HOOKS } = require('./hooks');
const { MessageList } = require('./processor');
const { fillMessages, plainObject } = require('./effects');

function decodeMessages(list) {
  return (list || []).map(convert.messageFromProto);
}

/** Each message's source by id (RunContext.message_sources; proto-loader gives a map as an object). */
function sourcesOf(req) {
  return (req.context && req.context.message_sources) || {};
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

/**
 * Per unary hook: `decode(req)` returns `{ args, ...kept }` (the hook's own arguments, merged into the
 * base ones, and what encode needs again, e.g. the messageList); `encode(result, kept, args)`
 * returns the response without effects.
 */
const CODECS = {
  processInput: {
    decode(req) {
      const messageList = new MessageList(decodeMessages(req.all_messages), sourcesOf(req));
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
  },

  processInputStep: {
    decode(req) {
      const messages = decodeMessages(req.messages);
      const messageList = new MessageList(messages, sourcesOf(req));
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
  },

  processLLMRequest: {
    decode(req) {
      return {
        args: {
          prompt: convert.promptFromProto(req.prompt),
          model: req.model || '',
          modelSpecVersion: req.model_spec_version || '',
          steps: (req.steps || []).map(convert.stepFromProto),
        },
      };
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
          // the recorded results of its tool calls: replayed by the orchestrator, not run again
          if (result.toolResults !== undefined && result.toolResults !== null) {
            if (!Array.isArray(result.toolResults)) throw new TypeError('toolResults must be an array');
            resp.cached_tool_results = result.toolResults.map((r) => ({
              tool_call_id: String(r.toolCallId),
              tool_name: String(r.toolName ?? ''),
              args: convert.toValue(r.args),
              result: convert.toValue(r.result),
            }));
          }
        }
      } catch (err) {
        throw new InternalError(`processLLMRequest returned a malformed value: ${err.message}`);
      }
      return resp;
    },
  },

  processLLMResponse: {
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
    encode(result) {
      // { outputResultIfClean: true } asks for processOutputResult at the run's clean end; else ignored
      return plainObject(result) && result.outputResultIfClean ? { output_result_if_clean: true } : {};
    },
  },

  processOutputStep: {
    decode(req) {
      const messages = decodeMessages(req.messages);
      const messageList = new MessageList(messages, sourcesOf(req));
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
  },

  processToolResult: {
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
  },

  processOutputResult: {
    decode(req) {
      const messages = decodeMessages(req.messages);
      const messageList = new MessageList(messages, sourcesOf(req));
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
  },

  processAPIError: {
    decode(req) {
      const messages = decodeMessages(req.messages);
      const messageList = new MessageList(messages, sourcesOf(req));
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
      if (plainObject(result)) {
        resp.retry = Boolean(result.retry);
        // The wait before the retry is the orchestrator's (bounded by the run's deadline), not a sleep in the hook.
        if (result.delayMs !== undefined) {
          const delay = Number(result.delayMs);
          if (!Number.isFinite(delay) || delay < 0) {
            throw new InternalError(`processAPIError returned delayMs ${String(result.delayMs)}; expected a number >= 0`);
          }
          resp.retry_delay_ms = delay;
        }
      } else if (result !== undefined && result !== null) {
        throw new InternalError(`processAPIError returned ${convert.describe(result)}; expected { retry: boolean, delayMs? } or nothing`);
      }
      return resp;
    },
  },

  executeTool: {
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
  },
};

// Every unary hook of the table has a codec and nothing else has one: a hook added to the table
// without its codec fails when the SDK loads, not when the orchestrator first calls it.
const unary = HOOKS.filter((h) => !h.streaming).map((h) => h.name);
const missing = unary.filter((name) => !(name in CODECS));
const extra = Object.keys(CODECS).filter((name) => !unary.includes(name));
if (missing.length || extra.length) {
  throw new Error(`hook codecs out of step with the hook table: missing ${JSON.stringify(missing)}, extra ${JSON.stringify(extra)}`);
}

module.exports = { CODECS };
