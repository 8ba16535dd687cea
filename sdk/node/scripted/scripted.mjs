// Scripted processors: the conformance scenarios' rule language (../../../../shared/conformance/
// FORMAT.md) as Node processors, the twin of sidecars/scripted.py. A scenario's PROCESSOR
// ({id, processDataParts, speculative, processInput: [RULE...], ...}) becomes a processor
// implementing exactly the hooks it lists; `speculative: true` declares it speculative.

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

  /**
   * Run the rules in order: each `when` is judged on `context()` as the earlier rules' actions left
   * it (a counter rule 1 increments is visible to rule 2), then its actions run in order.
   */
  async run(context, act) {
    for (const rule of this.rules) {
      if (this.holds(rule.when || {}, context())) {
        for (const action of rule.do || []) await act(action);
      }
    }
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
    let messages = kw.messages;
    let systems = kw.systemMessages;
    let changedMessages = false;
    let changedSystems = false;
    const result = {};
    await this.script[name].run(
      () => ({ ...kw, text: textOfMessages(messages) }),
      async (action) => {
        if (await common(this, action, kw)) return;
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
      },
    );
    if (changedMessages) result.messages = messages;
    if (changedSystems) result.systemMessages = systems;
    return Object.keys(result).length ? result : undefined;
  };
}

/** A hook whose rules may only use the common actions (abort, count, custom). */
function effectsOnly(name) {
  return async function (kw) {
    const text = name === 'processOutputStep' ? kw.text : null;
    await this.script[name].run(
      () => ({ ...kw, text }),
      async (action) => {
        if (!(await common(this, action, kw))) throw invalid(action, name);
      },
    );
    return undefined;
  };
}

async function llmRequest(kw) {
  let prompt = kw.prompt;
  let changed = false;
  await this.script.processLLMRequest.run(
    () => ({ ...kw, text: textOfPrompt(prompt) }),
    async (action) => {
      if (await common(this, action, kw)) return;
      if (!('replaceText' in action)) throw invalid(action, 'processLLMRequest');
      const spec = action.replaceText;
      prompt = clone(prompt);
      for (const msg of prompt) {
        if (msg.role === 'system') continue;
        for (const part of msg.content) if (part.type === 'text') part.text = replaceLiteral(spec.pattern, spec.with, part.text);
      }
      changed = true;
    },
  );
  return changed ? { prompt } : undefined;
}

async function outputStream(kw) {
  let part = kw.part;
  let dropped = false;
  await this.script.processOutputStream.run(
    () => ({ ...kw, part, text: part.type === 'text-delta' ? part.payload.text : null }),
    async (action) => {
      if (await common(this, action, kw)) return;
      if ('drop' in action) {
        dropped = true;
      } else if ('replaceText' in action) {
        if (part.type !== 'text-delta') return;
        const spec = action.replaceText;
        part = { ...part, payload: { ...part.payload, text: replaceLiteral(spec.pattern, spec.with, part.payload.text) } };
      } else {
        throw invalid(action, 'processOutputStream');
      }
    },
  );
  return dropped ? null : part;
}

async function toolResult(kw) {
  const text = JSON.stringify(kw.result);
  let newResult;
  await this.script.processToolResult.run(
    () => ({ ...kw, retryCount: 0, text }),
    async (action) => {
      if (await common(this, action, kw)) return;
      if (!('setResult' in action)) throw invalid(action, 'processToolResult');
      newResult = action.setResult;
    },
  );
  return newResult;
}

async function outputResult(kw) {
  let messages = kw.messages;
  let changed = false;
  await this.script.processOutputResult.run(
    () => ({ ...kw, text: kw.result.text }),
    async (action) => {
      if (await common(this, action, kw)) return;
      if ('replaceText' in action) {
        messages = rewriteMessages(messages, action.replaceText.pattern, action.replaceText.with, ['assistant']);
      } else if ('metadata' in action) {
        messages = clone(messages);
        for (const msg of messages) {
          if (msg.role === 'assistant') msg.content.metadata = { ...(msg.content.metadata || {}), ...action.metadata };
        }
      } else {
        throw invalid(action, 'processOutputResult');
      }
      changed = true;
    },
  );
  return changed ? messages : undefined;
}

async function apiError(kw) {
  let retry = false;
  await this.script.processAPIError.run(
    () => ({ ...kw, text: kw.error.message }),
    async (action) => {
      if (await common(this, action, kw)) return;
      if (!action.retry) throw invalid(action, 'processAPIError');
      retry = true;
    },
  );
  return retry ? { retry: true } : undefined;
}

const IMPLEMENTATIONS = {
  processInput: inputHook('processInput'),
  processInputStep: inputHook('processInputStep'),
  processLLMRequest: llmRequest,
  processLLMResponse: effectsOnly('processLLMResponse'),
  processOutputStream: outputStream,
  processOutputStep: effectsOnly('processOutputStep'),
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
  const processor = { id: spec.id, processDataParts: Boolean(spec.processDataParts), speculative: Boolean(spec.speculative), script: {} };
  for (const hook of HOOKS) {
    if (hook in spec) {
      processor.script[hook] = new Script(hook, spec[hook]);
      processor[hook] = IMPLEMENTATIONS[hook];
    }
  }
  return processor;
}

/** Every scripted processor a scenario declares (agent and every call's lanes), once per id. */
export function scenarioProcessors(scenario) {
  const specs = new Map();
  const calls = Array.isArray(scenario.calls) ? scenario.calls : [scenario.call || {}];
  const sources = [scenario.agent || {}, ...calls.map((call) => call.options || {})];
  for (const source of sources) {
    for (const spec of laneSpecs(source)) {
      if (specs.has(spec.id) && JSON.stringify(specs.get(spec.id)) !== JSON.stringify(spec)) {
        throw new Error(`two different scripted processors share the id ${JSON.stringify(spec.id)}`);
      }
      specs.set(spec.id, spec);
    }
  }
  return [...specs.values()].map(buildProcessor);
}

/** The processor specs of an agent's or a call's lanes, those of every case and default of a
 * lane chosen from the request context (`inputProcessorsByContext`) included. */
function laneSpecs(source) {
  const out = [];
  for (const lane of ['inputProcessors', 'outputProcessors', 'errorProcessors']) out.push(...(source[lane] || []));
  for (const lane of ['inputProcessorsByContext', 'outputProcessorsByContext']) {
    const chosen = source[lane] || {};
    for (const specs of [...Object.values(chosen.cases || {}), chosen.default || []]) out.push(...specs);
  }
  return out;
}
