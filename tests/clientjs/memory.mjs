// A conversation with memory through the real @mastra/client-js, unchanged; prints what it saw as JSON.
// usage: node memory.mjs BASE_URL API_KEY RESOURCE OTHER_API_KEY   (run by tests/e2e/service/test_clientjs_memory.py)
// API_KEY is bound to RESOURCE on the server; OTHER_API_KEY to another resource.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey, resource, otherKey] = process.argv.slice(2);
const connect = (key) => new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${key}` }, retries: 0 });
const client = connect(apiKey);
const stranger = connect(otherKey);

async function failure(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { status: error.status, body: error.body };
  }
}

// The demo model answers the last user turn of its prompt. A call whose input is only a system
// message therefore answers the last user turn the thread's history brought into the prompt.
const recall = [{ role: "system", content: "Say again what the user said." }];

const out = {};
out.status = await client.getMemoryStatus("assistant");
const created = await client.createMemoryThread({
  agentId: "assistant",
  resourceId: resource,
  title: "Chat with Ada",
  metadata: { channel: "e2e" },
});
out.created = created;
const agent = client.getAgent("assistant");
const memory = { thread: created.id, resource };
out.first = (await agent.generate("My name is Ada.", { memory })).text;
out.second = (await agent.generate(recall, { memory })).text;
out.fresh = (await agent.generate(recall, { memory: { thread: `${created.id}-fresh`, resource } })).text;

const thread = client.getMemoryThread({ threadId: created.id, agentId: "assistant" });
out.got = await thread.get();
out.updated = await thread.update({ title: "Ada, renamed" });
out.messages = (await thread.listMessages()).messages;
out.saved = await client.saveMessageToMemory({
  agentId: "assistant",
  messages: [{ id: "m-by-hand", role: "user", content: "saved by hand", threadId: created.id, resourceId: resource }],
});
out.afterSave = (await thread.listMessages({ page: 0, perPage: 10 })).messages.map((m) => m.id);
out.listed = await client.listMemoryThreads({ agentId: "assistant", resourceId: resource });

const foreign = stranger.getMemoryThread({ threadId: created.id, agentId: "assistant" });
out.stranger = {
  get: await failure(() => foreign.get()),
  messages: await failure(() => foreign.listMessages()),
  update: await failure(() => foreign.update({ title: "mine now" })),
  delete: await failure(() => foreign.delete()),
  listed: (await stranger.listMemoryThreads({ agentId: "assistant" })).threads,
};

out.deleted = await thread.delete();
out.afterDelete = await failure(() => thread.get());
process.stdout.write(JSON.stringify(out));
