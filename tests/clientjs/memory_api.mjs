// Every memory method of @mastra/client-js 1.47, called unchanged against one procmesh-orchestrator,
// with working memory kept by a scripted model (tests/e2e/service/test_clientjs_memory_api.py).
// usage: node memory_api.mjs BASE_URL API_KEY RESOURCE
// Prints {methods, probes}: each {ok: value} or {status, body} of the error the client threw.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey, resource] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { status: error.status ?? null, body: error.body ?? String(error) };
  }
}

const methods = {};
const probes = {};
const agentId = "keeper";
const keeper = client.getAgent(agentId);

// The scripted model updates the working memory in the first thread, then answers the second.
probes.firstThread = await attempt(async () => (await keeper.generate("My name is Ada.", { memory: { thread: "t1", resource } })).text);
probes.secondThread = await attempt(async () => (await keeper.generate("Who am I?", { memory: { thread: "t2", resource } })).text);
probes.readOnly = await attempt(async () => (await keeper.generate("Still me.", { memory: { thread: "t2", resource, options: { readOnly: true, lastMessages: 1 } } })).text);
probes.badOption = await attempt(() => keeper.generate("x", { memory: { thread: "t2", resource, options: { workingMemory: { enabled: false } } } }));

methods["getMemoryStatus"] = await attempt(() => client.getMemoryStatus(agentId));
methods["getMemoryConfig"] = await attempt(() => client.getMemoryConfig({ agentId }));
methods["createMemoryThread"] = await attempt(() => client.createMemoryThread({ agentId, resourceId: resource, threadId: "t3", title: "Third" }));
methods["listMemoryThreads"] = await attempt(() => client.listMemoryThreads({ agentId, resourceId: resource }));
methods["getWorkingMemory"] = await attempt(() => client.getWorkingMemory({ agentId, threadId: "t1", resourceId: resource }));
methods["updateWorkingMemory"] = await attempt(() => client.updateWorkingMemory({ agentId, threadId: "t1", resourceId: resource, workingMemory: "# User Information\n- **First Name**: Ada\n- **Pet**: Rex" }));
probes.afterUpdate = await attempt(() => client.getWorkingMemory({ agentId, threadId: "t3", resourceId: resource }));
probes.updateUnknownThread = await attempt(() => client.updateWorkingMemory({ agentId, threadId: "nope", resourceId: resource, workingMemory: "x" }));
methods["searchMemory"] = await attempt(() => client.searchMemory({ agentId, resourceId: resource, threadId: "t1", searchQuery: "Ada" }));
methods["saveMessageToMemory"] = await attempt(() => client.saveMessageToMemory({
  agentId,
  messages: [
    { id: "m-a", role: "user", content: "first by hand", threadId: "t3", resourceId: resource },
    { id: "m-b", role: "user", content: "second by hand", threadId: "t3", resourceId: resource },
    { id: "m-c", role: "user", content: "third by hand", threadId: "t3", resourceId: resource },
  ],
}));
methods["listThreadMessages"] = await attempt(() => client.listThreadMessages("t3", { agentId }));
const thread = client.getMemoryThread({ threadId: "t3", agentId });
methods["getMemoryThread(id).get"] = await attempt(() => thread.get());
methods["getMemoryThread(id).update"] = await attempt(() => thread.update({ title: "Third, renamed", metadata: { k: 1 }, resourceId: resource }));
methods["getMemoryThread(id).listMessages"] = await attempt(() => thread.listMessages());
methods["getMemoryThread(id).clone"] = await attempt(() => thread.clone({ newThreadId: "t3-copy", options: { messageLimit: 2 } }));
methods["getMemoryThread(id).deleteMessages"] = await attempt(() => thread.deleteMessages(["m-a", { id: "m-b" }]));
probes.afterDelete = await attempt(async () => (await thread.listMessages()).messages.map((m) => m.id));
probes.cloneKept = await attempt(async () => (await client.getMemoryThread({ threadId: "t3-copy", agentId }).listMessages()).messages.map((m) => m.content));
methods["getMemoryThread(id).transfer"] = await attempt(() => thread.transfer({ resourceId: "someone-else" }));
methods["getObservationalMemory"] = await attempt(() => client.getObservationalMemory({ agentId, resourceId: resource, threadId: "t3" }));
methods["awaitBufferStatus"] = await attempt(() => client.awaitBufferStatus({ agentId, resourceId: resource, threadId: "t3" }));
methods["listThreadMessages(networkId)"] = await attempt(() => client.listThreadMessages("t3", { networkId: "net" }));
methods["deleteThread(networkId)"] = await attempt(() => client.deleteThread("t3", { networkId: "net" }));
methods["getMemoryThread(id).delete"] = await attempt(() => client.getMemoryThread({ threadId: "t3-copy", agentId }).delete());
methods["deleteThread(agentId)"] = await attempt(() => client.deleteThread("t3", { agentId }));
process.stdout.write(JSON.stringify({ methods, probes }));
