// The bodies of approve / decline, observe and the memory writes, through the real @mastra/client-js:
// a key procmesh cannot honour is a 400 naming it, and the same call without it then works (nothing
// was lost). usage: node strict_bodies.mjs BASE_URL API_KEY RESOURCE
// (run by tests/e2e/service/test_strict_bodies.py; `teller`'s `weather` needs approval.)
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey, resource] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const teller = client.getAgent("teller");
const ASK = "What is the weather like?";

async function chunksOf(response) {
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { status: error.status ?? null, body: error.body ?? String(error) };
  }
}

async function suspend(thread) {
  const chunks = await chunksOf(await teller.stream(ASK, { memory: { thread, resource } }));
  const asked = chunks.find((c) => c.type === "tool-call-approval");
  return { runId: asked?.runId, toolCallId: asked?.payload?.toolCallId };
}
const types = (chunks) => chunks.map((c) => c.type);
const out = {};

// approve-tool-call with the reference's `model`: refused; then approved as it is.
const approve = await suspend("th-strict-approve");
out.approveWithModel = await attempt(async () => types(await chunksOf(await teller.approveToolCall({ ...approve, model: "openai/gpt-4o" }))));
out.approveAfter = await attempt(async () => types(await chunksOf(await teller.approveToolCall(approve))));

// decline-tool-call-generate with a key the reference's route does not take: refused; then declined.
const decline = await suspend("th-strict-decline");
out.declineWithExtra = await attempt(() => teller.declineToolCallGenerate({ ...decline, reason: "no", colour: "red" }));
out.declineAfter = await attempt(async () => (await teller.declineToolCallGenerate({ ...decline, reason: "no" })).finishReason);

// observe with a key it does not take: refused; the run's events are still all there.
const durable = await chunksOf(await teller.stream("hello", { durable: true }));
const runId = durable[0].runId;
out.observeWithExtra = await attempt(() => teller.observe({ runId, offset: 0, from: "start" }));
out.observeAfter = await attempt(async () => types(await chunksOf(await teller.observe({ runId }))));
out.durableTypes = types(durable);

// createMemoryThread sends its whole params (agentId and requestContext too): accepted as the
// query's copies; an unknown key is refused and no thread is made.
out.createWithExtra = await attempt(() => client.createMemoryThread({ agentId: "teller", resourceId: resource, threadId: "t-strict", titel: "typo" }));
out.threadAfterRefusal = await attempt(() => client.getMemoryThread({ threadId: "t-strict", agentId: "teller" }).get());
out.create = await attempt(async () => (await client.createMemoryThread({ agentId: "teller", resourceId: resource, threadId: "t-strict", title: "Strict", requestContext: { tier: "gold" } })).title);
out.saveWithExtra = await attempt(() => client.saveMessageToMemory({ agentId: "teller", messages: [{ id: "m-x", role: "user", content: "kept?", threadId: "t-strict", resourceId: resource }], format: "v2" }));
out.save = await attempt(async () => (await client.saveMessageToMemory({ agentId: "teller", messages: [{ id: "m-x", role: "user", content: "kept", threadId: "t-strict", resourceId: resource }] })).messages.length);
out.messages = await attempt(async () => (await client.listThreadMessages("t-strict", { agentId: "teller" })).messages.map((m) => m.id));

// Query parameters: what the client adds is taken (requestContext, partial, a tool's runId); a
// stored agent version procmesh does not have is refused by name, not answered with the config.
out.listPartial = await attempt(async () => Object.keys(await client.listAgents({ tier: "gold" }, true)));
out.versioned = await attempt(() => client.getAgent("teller", { versionId: "v2" }).details());
out.toolRunId = await attempt(() => client.getTool("clock").execute({ data: {}, runId: "run-7" }));
// generate / stream with the reference's `format` (client-js sends it as given): "aisdk" is refused
// by name, "mastra" (what procmesh streams) is taken.
out.generateAisdk = await attempt(() => teller.generate("hello", { format: "aisdk" }));
out.streamAisdk = await attempt(async () => types(await chunksOf(await teller.stream("hello", { format: "aisdk" }))));
out.generateMastra = await attempt(async () => (await teller.generate("hello", { format: "mastra" })).finishReason);
out.streamMastra = await attempt(async () => types(await chunksOf(await teller.stream("hello", { format: "mastra" }))));
process.stdout.write(JSON.stringify(out));
