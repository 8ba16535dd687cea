// P2(c): the same 1,000-delta streamed run on the reference engine (@mastra/core) with
// 3 in-process pass-through processOutputStream processors. Prints {"median_ms": ...}.
// usage: node reference_stream.mjs ORACLE_HOME N_DELTAS RUNS
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const [home, nArg, runsArg] = process.argv.slice(2)
const require = createRequire(home + '/package.json')
const load = spec => import(pathToFileURL(require.resolve(spec)).href)
for (const m of ['log', 'info', 'warn', 'error', 'debug']) console[m] = () => {}

const { Agent } = await load('@mastra/core/agent')
const { MockLanguageModelV2, simulateReadableStream } = await load('ai/test')
const n = Number(nArg)
const runs = Number(runsArg)

function model() {
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

const pass = id => ({ id, processOutputStream: async ({ part }) => part })

const times = []
for (let i = 0; i < runs + 2; i++) {
  const agent = new Agent({
    id: 'bench', name: 'bench', instructions: 'You are helpful.', model: model(),
    outputProcessors: [pass('pass-1'), pass('pass-2'), pass('pass-3')],
  })
  const t0 = performance.now()
  const stream = await agent.stream('go', { modelSettings: { maxRetries: 0 } })
  let count = 0
  for await (const chunk of stream.fullStream) if (chunk.type === 'text-delta') count++
  const elapsed = performance.now() - t0
  if (count !== n) throw new Error(`expected ${n} deltas, got ${count}`)
  if (i >= 2) times.push(elapsed)
}
times.sort((a, b) => a - b)
console.log = (...a) => process.stdout.write(a.join(' ') + '\n')
console.log(JSON.stringify({ median_ms: times[Math.floor(times.length / 2)], runs: times.length }))
