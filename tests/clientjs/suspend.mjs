// A tool that suspends itself, resumed with data through the real @mastra/client-js, unchanged:
// stream on replica A until the `tool-call-suspended` chunk, `resumeStream(resumeData, {runId})`
// (no toolCallId, as the client allows) on replica B, then the same resume again. Prints what it saw as JSON.
// usage: node suspend.mjs A_URL API_KEY B_URL   (run by tests/e2e/service/test_replicas_suspend.py)
import { MastraClient } from "@mastra/client-js";

const [aUrl, apiKey, bUrl] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${apiKey}` };
const a = new MastraClient({ baseUrl: aUrl, headers, retries: 0 }).getAgent("teller");
const b = new MastraClient({ baseUrl: bUrl, headers, retries: 0 }).getAgent("teller");

async function chunksOf(response) {
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

const suspended = await chunksOf(await a.stream("What is the weather like?"));
const asked = suspended.find((c) => c.type === "tool-call-suspended");
// the client makes toolCallId optional: without it, the run's only awaited call is resumed
const where = { runId: asked.runId };
const resumed = await chunksOf(await b.resumeStream({ unit: "fahrenheit" }, where));
let again;
try {
  await chunksOf(await b.resumeStream({ unit: "celsius" }, where));
  again = { ok: true };
} catch (error) {
  again = { status: error.status ?? null, body: error.body ?? String(error) };
}
console.log(JSON.stringify({ suspended, resumed, again }));
