// generate() results, stream framing and an aborted generate, with the real @mastra/client-js 1.47
// (tests/e2e/service/test_clientjs_results.py).
// usage: node results.mjs BASE_URL API_KEY
// Prints {generated, fields, chunks} at once; then, for the agent `held` (a model that never ends),
// starts a generate with an abortSignal, prints {asked: true} and aborts once a line arrives on
// stdin; then suspends a run of `vaulted` at its tool's approval, approves it to its end
// (approveToolCallGenerate; the resumed model never ends) and aborts that the same way. Last it
// prints {aborted, approveAborted}: the two errors' names.
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

const lines = createInterface({ input: process.stdin });
// Starts call(signal), prints {asked: true}, aborts once a line arrives on stdin: the error's name.
async function abortedOnce(call) {
  const controller = new AbortController();
  lines.once("line", () => controller.abort());
  try {
    const pending = call(controller.signal);
    console.log(JSON.stringify({ asked: true }));
    return { answered: await pending };
  } catch (error) {
    return error.name;
  }
}
const memory = (thread) => ({ thread, resource: "ada" });
const aborted = await abortedOnce((abortSignal) => client.getAgent("held").generate("go", { abortSignal, memory: memory("t-abort") }));

// approveToolCallGenerate takes no abortSignal of its own: a client built with one aborts it.
const suspended = [];
await (await client.getAgent("vaulted").stream("open it", { memory: memory("t-approve-abort") })).processDataStream({
  onChunk: async (chunk) => { suspended.push(chunk); },
});
const asked = suspended.find((c) => c.type === "tool-call-approval");
const approveAborted = await abortedOnce((abortSignal) =>
  new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0, abortSignal })
    .getAgent("vaulted")
    .approveToolCallGenerate({ runId: asked.runId, toolCallId: asked.payload.toolCallId }),
);
lines.close();
console.log(JSON.stringify({ aborted, approveAborted }));
