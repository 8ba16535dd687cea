// The reference engine (@mastra/core) as a bench worker, so its runs alternate with ours.
// usage: node reference.mjs ORACLE_HOME; then one JSON request per stdin line, one
// {"ms": ...} answer per stdout line (a run's wall time, the stream fully read):
//   {"run": "stream", "deltas": N, "processors": K}  N text deltas through K in-process
//       pass-through processOutputStream processors (P2)
//   {"run": "guards", "guards": K, "delayMs": D}     K input processors whose processInput takes
//       D ms, one after another as the reference runs them, then a one-delta answer (P6)
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

function model(n) {
  return new MockLanguageModelV2({
    provider: 'mock',
    modelId: 'bench',
    doStream: async () => {
      const chunks = [{ type: 'stream-start', warnings: [] }, { type: 'text-start', id: 't' }]
      for (let i = 0; i < n; i++) chunks.push({ type: 'text-delta', id: 't', delta: `w${i} ` })
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

function agentFor(req) {
  const base = { id: 'bench', name: 'bench', instructions: 'You are helpful.' }
  if (req.run === 'stream') {
    return [new Agent({ ...base, model: model(req.deltas), outputProcessors: ids(req.processors, 'pass').map(pass) }), req.deltas]
  }
  if (req.run === 'guards') {
    return [new Agent({ ...base, model: model(1), inputProcessors: ids(req.guards, 'guard').map(id => guard(id, req.delayMs)) }), 1]
  }
  throw new Error(`unknown run ${JSON.stringify(req.run)}`)
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue
  const [agent, expect] = agentFor(JSON.parse(line))
  const t0 = performance.now()
  const stream = await agent.stream('go', { modelSettings: { maxRetries: 0 } })
  let count = 0
  for await (const chunk of stream.fullStream) if (chunk.type === 'text-delta') count++
  const ms = performance.now() - t0
  if (count !== expect) throw new Error(`expected ${expect} deltas, got ${count}`)
  write(JSON.stringify({ ms }))
}
