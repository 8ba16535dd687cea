// The reference engine (@mastra/core) as a bench worker, so its runs alternate with ours.
// usage: node reference.mjs ORACLE_HOME; then one JSON request per stdin line, one
// {"ms": ...} answer per stdout line (a run's wall time, the stream fully read):
//   {"run": "stream", "deltas": N, "processors": K}  N text deltas through K in-process
//       pass-through processOutputStream processors (P2)
//   {"run": "guards", "guards": K, "delayMs": D}     K input processors whose processInput takes
//       D ms, one after another as the reference runs them, then a one-delta answer (P6)
//   {"run": "judged", "messages": [...], "deltas": [...], "judgeUrl": U, "judgeModel": M,
//    "judgeKey": K}  the reference's own five LLM-judged guards (input: prompt injection,
//       moderation, language, PII; output: moderation, system-prompt scrubber, PII) asking the
//       OpenAI-compatible judge at U for model M, over the given messages and streamed answer;
//       also answers {"firstChunkMs": ...} (P8; the judge counts the calls)
import { createInterface } from 'node:readline'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const [home] = process.argv.slice(2)
const require = createRequire(home + '/package.json')
const load = spec => import(pathToFileURL(require.resolve(spec)).href)
const write = line => process.stdout.write(line + '\n')
for (const m of ['log', 'info', 'warn', 'error', 'debug']) console[m] = () => {}

const { Agent } = await load('@mastra/core/agent')
const { MockLanguageModelV2, simulateReadableStream } = await load('ai/test')
const P = await load('@mastra/core/processors')

function model(n, deltas = Array.from({ length: n }, (_, i) => `w${i} `)) {
  return new MockLanguageModelV2({
    provider: 'mock',
    modelId: 'bench',
    doStream: async () => {
      const chunks = [{ type: 'stream-start', warnings: [] }, { type: 'text-start', id: 't' }]
      for (const delta of deltas) chunks.push({ type: 'text-delta', id: 't', delta })
      chunks.push({ type: 'text-end', id: 't' })
      chunks.push({ type: 'finish', finishReason: 'stop', usage: { inputTokens: 10, outputTokens: n, totalTokens: n + 10 } })
      // null delays: no timer between chunks, like the Python side's scripted model
      return { stream: simulateReadableStream({ chunks, initialDelayInMs: null, chunkDelayInMs: null }) }
    },
  })
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))
const pass = id => ({ id, processOutputStream: async ({ part }) => part })
const guard = (id, ms) => ({ id, processInput: async ({ messages }) => { await sleep(ms); return messages } })
const ids = (k, prefix) => Array.from({ length: k }, (_, i) => `${prefix}-${i + 1}`)

// the five built-in guards as P8 configures procmesh's (tests/e2e/guards/golden.py): defaults,
// language blocking what is not English
function judged(req) {
  const model = { id: `openai/${req.judgeModel}`, url: req.judgeUrl, apiKey: req.judgeKey }
  return {
    inputProcessors: [
      new P.PromptInjectionDetector({ model }),
      new P.ModerationProcessor({ model }),
      new P.LanguageDetector({ model, targetLanguages: ['English', 'en'], strategy: 'block' }),
      new P.PIIDetector({ model }),
    ],
    outputProcessors: [new P.ModerationProcessor({ model }), new P.SystemPromptScrubber({ model }), new P.PIIDetector({ model })],
  }
}

// [agent, its input, a check of the streamed text and delta count]
function agentFor(req) {
  const base = { id: 'bench', name: 'bench', instructions: 'You are helpful.' }
  const deltas = expect => (text, count) => count === expect || `expected ${expect} deltas, got ${count}`
  if (req.run === 'stream') {
    return [new Agent({ ...base, model: model(req.deltas), outputProcessors: ids(req.processors, 'pass').map(pass) }), 'go', deltas(req.deltas)]
  }
  if (req.run === 'guards') {
    return [new Agent({ ...base, model: model(1), inputProcessors: ids(req.guards, 'guard').map(id => guard(id, req.delayMs)) }), 'go', deltas(1)]
  }
  if (req.run === 'judged') {
    // the guards may re-cut the deltas (the PII detector buffers them): the text is what must arrive
    const answer = req.deltas.join('')
    const sameText = text => text === answer || `expected the answer, got ${JSON.stringify(text.slice(0, 200))}`
    return [new Agent({ ...base, model: model(req.deltas.length, req.deltas), ...judged(req) }), req.messages, sameText]
  }
  throw new Error(`unknown run ${JSON.stringify(req.run)}`)
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue
  const [agent, input, check] = agentFor(JSON.parse(line))
  const t0 = performance.now()
  const stream = await agent.stream(input, { modelSettings: { maxRetries: 0 } })
  let count = 0
  let text = ''
  let firstChunkMs = null
  for await (const chunk of stream.fullStream) {
    if (chunk.type !== 'text-delta') continue
    firstChunkMs ??= performance.now() - t0
    count++
    text += chunk.payload.text
  }
  const ms = performance.now() - t0
  const verdict = check(text, count)
  if (verdict !== true) throw new Error(verdict)
  write(JSON.stringify({ ms, firstChunkMs }))
}
