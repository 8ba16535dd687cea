// generate() results, stream framing and an aborted generate, with the real @mastra/client-js 1.47
// (tests/e2e/service/test_clientjs_results.py).
// usage: node results.mjs BASE_URL API_KEY
// Prints {generated, fields, chunks} at once; then, for the agent `held` (a model that never ends),
// starts a generate with an abortSignal, prints {asked: true}, aborts once a line arrives on stdin
// and prints {aborted: <error name>}.
import { createInterface } from "node:readline";
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const agent = client.getAgent("assistant");

const generated = await agent.generate("hello");
// what a user of the client's FullOutput type reads without checking first
const fields = {
  warnings: generated.warnings.length, sources: generated.sources.length, files: generated.files.length,
  reasoning: generated.reasoning.length, usedFallbackValue: generated.usedFallbackValue,
  stepWarnings: generated.steps[0].warnings.length, stepSources: generated.steps[0].sources.length,
};
const chunks = [];
await (await agent.stream("hello")).processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
const durable = [];
await (await agent.stream("hello", { durable: true })).processDataStream({ onChunk: async (chunk) => { durable.push(chunk); } });
console.log(JSON.stringify({ generated, fields, chunks, durable }));

const controller = new AbortController();
const lines = createInterface({ input: process.stdin });
lines.once("line", () => controller.abort());
let outcome;
try {
  const pending = client.getAgent("held").generate("go", { abortSignal: controller.signal, memory: { thread: "t-abort", resource: "ada" } });
  console.log(JSON.stringify({ asked: true }));
  outcome = { answered: await pending };
} catch (error) {
  outcome = { aborted: error.name };
}
lines.close();
console.log(JSON.stringify(outcome));
