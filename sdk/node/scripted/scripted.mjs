// Scripted processors: the conformance scenarios' rule language (../../../../shared/conformance/
// FORMAT.md) as Node processors, the twin of sidecars/scripted.py. A scenario's PROCESSOR
// ({id, processDataParts, processInput: [RULE...], ...}) becomes a processor implementing
// exactly the hooks it lists.

import { hooks } from '@procmesh/sdk';

const STEP_HOOKS = new Set(['processInputStep', 'processLLMRequest', 'processLLMResponse', 'processOutputStep', 'processToolResult', 'processAPIError']);

/** Replace every match of `pattern`; the replacement is inserted literally (no group references). */
export function replaceLiteral(pattern, replacement, text) {
  return text.replace(new RegExp(pattern, 'g'), () => replacement);
}

function textOfMessages(messages) {
  const texts = [];
  for (const msg of messages) {
    if (msg.role === 'system') continue;
    for (const p of msg.content.parts || []) if (p.type === 'text') texts.push(p.text ?? '');
  }
  return texts.join('\n');
}

function textOfPrompt(prompt) {
  const texts = [];
  for (const msg of prompt) {
    if (msg.role === 'system') continue;
    for (const p of msg.content) if (p.type === 'text') texts.push(p.text ?? '');
  }
  return texts.join('\n');
}

const clone = (value) => structuredClone(value);

function rewriteMessages(messages, pattern, replacement, roles = null) {
  return messages.map((original) => {
    const msg = clone(original);
    if (msg.role !== 'system' && (roles === null || roles.includes(msg.role))) {
      for (const part of msg.content.parts || []) {
        if (part.type === 'text') part.text = replaceLiteral(pattern, replacement, part.text);
      }
    }
    return msg;
  });
}

function invalid(action, hook) {
  return new Error(`action ${JSON.stringify(Object.keys(action).sort())} is not valid in ${hook}`);
}

/** Evaluates one hook's rules against what the hook was given. */
class Script {
  constructor(hook, rules) {
    this.hook = hook;
    this.rules = rules;
  }

  holds(cond, ctx) {
    const text = ctx.text;
    for (const [key, want] of Object.entries(cond)) {
      let ok;
      if (key === 'textContains') ok = text !== null && text !== undefined && text.includes(want);
      else if (key === 'textMatches') ok = text !== null && text !== undefined && new RegExp(want).test(text);
      else if (key === 'stepNumber') ok = STEP_HOOKS.has(this.hook) && ctx.stepNumber === want;
      else if (key === 'stepNumberGte') ok = STEP_HOOKS.has(this.hook) && ctx.stepNumber >= want;
      else if (key === 'retryCountLt') ok = ctx.retryCount < want;
      else if (key === 'partType') ok = this.hook === 'processOutputStream' && ctx.part.type === want;
      else if (key === 'stateGte') ok = (ctx.state[want.key] ?? 0) >= want.value;
      else if (key === 'errorStatus') ok = this.hook === 'processAPIError' && ctx.error.status === want;
      else throw new Error(`unknown condition ${JSON.stringify(key)}`);
      if (!ok) return false;
    }
    return true;
  }

  matching(ctx) {
    const actions = [];
    for (const rule of this.rules) {
      if (this.holds(rule.when || {}, ctx)) actions.push(...(rule.do || []));
    }
    return actions;
  }
}

/** Actions valid in several hooks; true when handled. */
async function common(proc, action, kw) {
  if ('abort' in action) {
    const spec = action.abort;
    const options = {};
    if ('retry' in spec) options.retry = spec.retry;
    if ('metadata' in spec) options.metadata = spec.metadata;
    kw.abort(spec.reason, options);
  } else if ('count' in action) {
    kw.state[action.count] = (kw.state[action.count] ?? 0) + 1;
  } else if ('custom' in action) {
    const spec = action.custom;
    const data = 'dataFromState' in spec ? { [spec.dataFromState]: kw.state[spec.dataFromState] ?? 0 } : spec.data;
    await kw.writer.custom({ type: spec.type, data: data === undefined ? null : data });
  } else {
    return false;
  }
  return true;
}

function inputHook(name) {
  return async function (kw) {
    const actions = this.script[name].matching({ ...kw, text: textOfMessages(kw.messages) });
    let messages = kw.messages;
    let systems = kw.systemMessages;
    let changedMessages = false;
    let changedSystems = false;
    const result = {};
    for (const action of actions) {
      if (await common(this, action, kw)) continue;
      if ('replaceText' in action) {
        messages = rewriteMessages(messages, action.replaceText.pattern, action.replaceText.with);
        changedMessages = true;
      } else if ('systemMessage' in action) {
        systems = [
          ...systems,
          {
            id: `sys-${systems.length}-${this.id}`,
            role: 'system',
            content: { format: 2, parts: [{ type: 'text', text: action.systemMessage }] },
          },
        ];
        changedSystems = true;
      } else if ('signal' in action && name === 'processInputStep') {
        const spec = action.signal;
        const signal = { type: 'reactive', contents: spec.contents };
        for (const key of ['attributes', 'transient']) if (key in spec) signal[key] = spec[key];
        await kw.sendSignal(signal);
      } else if ('toolChoice' in action && name === 'processInputStep') {
        result.toolChoice = action.toolChoice;
      } else {
        throw invalid(action, name);
      }
    }
    if (changedMessages) result.messages = messages;
    if (changedSystems) result.systemMessages = systems;
    return Object.keys(result).length ? result : undefined;
  };
}

async function llmRequest(kw) {
  let prompt = kw.prompt;
  let changed = false;
  for (const action of this.script.processLLMRequest.matching({ ...kw, text: textOfPrompt(prompt) })) {
    if (await common(this, action, kw)) continue;
    if ('replaceText' in action) {
      const spec = action.replaceText;
      prompt = clone(prompt);
      for (const msg of prompt) {
        if (msg.role === 'system') continue;
        for (const part of msg.content) if (part.type === 'text') part.text = replaceLiteral(spec.pattern, spec.with, part.text);
      }
      changed = true;
    } else {
      throw invalid(action, 'processLLMRequest');
    }
  }
  return changed ? { prompt } : undefined;
}

async function llmResponse(kw) {
  for (const action of this.script.processLLMResponse.matching({ ...kw, text: null })) {
    if (!(await common(this, action, kw))) throw invalid(action, 'processLLMResponse');
  }
  return undefined;
}

async function outputStream(kw) {
  let part = kw.part;
  const text = part.type === 'text-delta' ? part.payload.text : null;
  for (const action of this.script.processOutputStream.matching({ ...kw, text })) {
    if (await common(this, action, kw)) continue;
    if ('drop' in action) return null;
    if ('replaceText' in action && part.type === 'text-delta') {
      const spec = action.replaceText;
      part = { ...part, payload: { ...part.payload, text: replaceLiteral(spec.pattern, spec.with, part.payload.text) } };
    } else {
      throw invalid(action, 'processOutputStream');
    }
  }
  return part;
}

async function outputStep(kw) {
  for (const action of this.script.processOutputStep.matching({ ...kw, text: kw.text })) {
    if (!(await common(this, action, kw))) throw invalid(action, 'processOutputStep');
  }
  return undefined;
}

async function toolResult(kw) {
  const text = JSON.stringify(kw.result);
  let newResult;
  for (const action of this.script.processToolResult.matching({ ...kw, retryCount: 0, text })) {
    if (await common(this, action, kw)) continue;
    if ('setResult' in action) newResult = action.setResult;
    else throw invalid(action, 'processToolResult');
  }
  return newResult;
}

async function outputResult(kw) {
  let messages = kw.messages;
  let changed = false;
  for (const action of this.script.processOutputResult.matching({ ...kw, text: kw.result.text })) {
    if (await common(this, action, kw)) continue;
    if ('replaceText' in action) {
      messages = rewriteMessages(messages, action.replaceText.pattern, action.replaceText.with, ['assistant']);
      changed = true;
    } else if ('metadata' in action) {
      messages = clone(messages);
      for (const msg of messages) {
        if (msg.role === 'assistant') msg.content.metadata = { ...(msg.content.metadata || {}), ...action.metadata };
      }
      changed = true;
    } else {
      throw invalid(action, 'processOutputResult');
    }
  }
  return changed ? messages : undefined;
}

async function apiError(kw) {
  let retry = false;
  for (const action of this.script.processAPIError.matching({ ...kw, text: kw.error.message })) {
    if (await common(this, action, kw)) continue;
    if (action.retry) retry = true;
    else throw invalid(action, 'processAPIError');
  }
  return retry ? { retry: true } : undefined;
}

const IMPLEMENTATIONS = {
  processInput: inputHook('processInput'),
  processInputStep: inputHook('processInputStep'),
  processLLMRequest: llmRequest,
  processLLMResponse: llmResponse,
  processOutputStream: outputStream,
  processOutputStep: outputStep,
  processToolResult: toolResult,
  processOutputResult: outputResult,
  processAPIError: apiError,
};

/** The hooks a scenario may script: those of the SDK's hook table implemented here (not executeTool). */
export const HOOKS = hooks.HOOK_NAMES.filter((name) => name in IMPLEMENTATIONS);
const unknown = Object.keys(IMPLEMENTATIONS).filter((name) => !HOOKS.includes(name));
if (unknown.length) throw new Error(`scripted implementations for hooks the SDK does not have: ${unknown.join(', ')}`);

/** A processor implementing exactly the hooks `spec` lists. */
export function buildProcessor(spec) {
  const processor = { id: spec.id, processDataParts: Boolean(spec.processDataParts), script: {} };
  for (const hook of HOOKS) {
    if (hook in spec) {
      processor.script[hook] = new Script(hook, spec[hook]);
      processor[hook] = IMPLEMENTATIONS[hook];
    }
  }
  return processor;
}

/** Every scripted processor a scenario declares (agent and call lanes), once per id. */
export function scenarioProcessors(scenario) {
  const specs = new Map();
  const sources = [scenario.agent || {}, (scenario.call || {}).options || {}];
  for (const source of sources) {
    for (const lane of ['inputProcessors', 'outputProcessors', 'errorProcessors']) {
      for (const spec of source[lane] || []) {
        if (specs.has(spec.id) && JSON.stringify(specs.get(spec.id)) !== JSON.stringify(spec)) {
          throw new Error(`two different scripted processors share the id ${JSON.stringify(spec.id)}`);
        }
        specs.set(spec.id, spec);
      }
    }
  }
  return [...specs.values()].map(buildProcessor);
}
