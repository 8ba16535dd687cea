// Client tools and tool approval through the real @mastra/client-js, unchanged; prints what it saw as JSON.
// usage: node tools.mjs BASE_URL API_KEY RESOURCE   (run by tests/e2e/service/test_clientjs.py)
// The agents (the test's config): `helper` (no memory) and `keeper` (memory) have no tools of their
// own; `teller` has the server tool `weather`, which needs approval. All answer with the demo model.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey, resource] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const ASK = "What is the weather like?";

// The client tool: the demo model calls `weather` (by that name) and answers from its result.
const executed = [];
function clientTools(label) {
  return {
    weather: {
      description: "The weather where the user is (runs in the client).",
      inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      execute: async (args, context) => {
        executed.push({ label, args, toolCallId: context?.agent?.toolCallId ?? null });
        return { forecast: `drizzle-${label}`, city: args.city };
      },
    },
  };
}

async function chunksOf(response) {
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

async function failure(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { status: error.status, body: error.body };
  }
}

async function messagesOf(agentId, threadId) {
  return (await client.getMemoryThread({ threadId, agentId }).listMessages()).messages;
}

const out = { executed };
const helper = client.getAgent("helper");
const keeper = client.getAgent("keeper");
const teller = client.getAgent("teller");

const generated = await helper.generate(ASK, { clientTools: clientTools("generate") });
out.generate = { text: generated.text, finishReason: generated.finishReason, status: generated.status };
out.stream = await chunksOf(await helper.stream(ASK, { clientTools: clientTools("stream") }));

const memory = (thread) => ({ thread, resource });
const kept = await keeper.generate(ASK, { clientTools: clientTools("generate-memory"), memory: memory("th-generate") });
out.generateMemory = { text: kept.text, finishReason: kept.finishReason, messages: await messagesOf("keeper", "th-generate") };
out.streamMemory = {
  chunks: await chunksOf(await keeper.stream(ASK, { clientTools: clientTools("stream-memory"), memory: memory("th-stream") })),
  messages: await messagesOf("keeper", "th-stream"),
};

// Approval: each run suspends at `weather`; the chunk names the run and the call.
async function suspend(thread) {
  const chunks = await chunksOf(await teller.stream(ASK, { memory: memory(thread) }));
  const asked = chunks.find((c) => c.type === "tool-call-approval");
  return { chunks, runId: asked?.runId, toolCallId: asked?.payload?.toolCallId };
}
const listed = async () => (await teller.listSuspendedRuns({ resourceId: resource })).runs;

out.approve = await suspend("th-approve");
out.approve.listedBefore = await listed();
const { runId, toolCallId } = out.approve;
out.approve.resumed = await chunksOf(await teller.approveToolCall({ runId, toolCallId }));
out.approve.listedAfter = await listed();
out.approve.again = await failure(() => teller.approveToolCallGenerate({ runId, toolCallId }));
out.approve.messages = await messagesOf("teller", "th-approve");

out.decline = await suspend("th-decline");
out.decline.resumed = await chunksOf(
  await teller.declineToolCall({ runId: out.decline.runId, toolCallId: out.decline.toolCallId, reason: "not now" }),
);

out.approveGenerate = await suspend("th-approve-generate");
out.approveGenerate.result = await teller.approveToolCallGenerate({
  runId: out.approveGenerate.runId,
  toolCallId: out.approveGenerate.toolCallId,
});

out.declineGenerate = await suspend("th-decline-generate");
out.declineGenerate.result = await teller.declineToolCallGenerate({
  runId: out.declineGenerate.runId,
  toolCallId: out.declineGenerate.toolCallId,
  reason: "not now",
});
out.listedAtEnd = await listed();

// A client tool with toModelOutput: the client runs the mapping and sends what it made on the tool
// result (providerOptions.mastra.modelOutput); the model answers from that, not from the result.
const mapped = {
  weather: {
    description: "The weather, mapped for the model.",
    inputSchema: { type: "object", properties: { city: { type: "string" } } },
    execute: async (args) => ({ forecast: "hail", city: args.city }),
    toModelOutput: (result) => ({ type: "text", value: `mapped ${result.forecast}` }),
  },
};
out.mappedGenerate = (await helper.generate(ASK, { clientTools: mapped })).text;
out.mappedStream = await chunksOf(await helper.stream(ASK, { clientTools: mapped }));
process.stdout.write(JSON.stringify(out));
