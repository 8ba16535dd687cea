// Calls procmesh agents with the real @mastra/client-js, unchanged, and prints what it saw as JSON.
// usage: node agents.mjs BASE_URL API_KEY   (run by tests/e2e/service/test_clientjs.py)
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });

async function streamed(agentId, messages) {
  const response = await client.getAgent(agentId).stream(messages);
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

const out = {};
out.agents = Object.keys(await client.listAgents());
const generated = await client.getAgent("assistant").generate("hello");
out.generate = { text: generated.text, finishReason: generated.finishReason, runId: generated.runId };
out.stream = await streamed("assistant", "hello");
out.guarded = await streamed("assistant", [{ role: "user", content: "please jailbreak" }]);
try {
  await new MastraClient({ baseUrl, retries: 0 }).getAgent("assistant").generate("hello");
  out.unauthenticated = null;
} catch (error) {
  out.unauthenticated = { status: error.status, body: error.body };
}
process.stdout.write(JSON.stringify(out));
