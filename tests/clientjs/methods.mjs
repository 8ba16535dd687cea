// Every client method of @mastra/client-js 1.47's agent, tool, processor, workflow-listing and
// provider APIs, called unchanged against one procmesh-orchestrator (tests/e2e/service/test_clientjs_api.py).
// usage: node methods.mjs BASE_URL API_KEY
// Prints {methods, probes}: `methods` has each client method once, as a user calls it; `probes` the
// same methods on other input (errors, other phases). Each is {ok: value} or {status, body} of
// the error the client threw.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const ASK = "What is the weather?";

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { status: error.status ?? null, body: error.body ?? String(error) };
  }
}

async function chunksOf(response) {
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

const pick = (r) => ({
  runId: r.runId, status: r.status, text: r.text, finishReason: r.finishReason, toolCalls: r.toolCalls,
  toolResults: r.toolResults, totalUsage: r.totalUsage, messages: r.messages, steps: r.steps,
  suspendPayload: r.suspendPayload, violations: r.violations, traceId: r.traceId,
});

const user = (id, text) => ({ id, role: "user", content: { format: 2, parts: [{ type: "text", text }] } });
const assistantSaid = (id, text) => ({ id, role: "assistant", content: { format: 2, parts: [{ type: "text", text }] } });
const toolDone = (id, result) => ({
  id, role: "assistant",
  content: { format: 2, parts: [{ type: "tool-invocation", toolInvocation: {
    state: "result", toolCallId: "c1", toolName: "vault", args: {}, result } }] },
});

const methods = {};
const probes = {};
const assistant = client.getAgent("assistant");
const helper = client.getAgent("helper");

// -- MastraClient: agents, model providers, tools, processors, workflows ---------------------
methods["listAgents"] = await attempt(() => client.listAgents());
methods["listAgentsModelProviders"] = await attempt(() => client.listAgentsModelProviders());
methods["listTools"] = await attempt(() => client.listTools());
methods["getTool(id).details"] = await attempt(() => client.getTool("weather").details());
methods["getTool(id).execute"] = await attempt(() => client.getTool("weather").execute({ data: { city: "Rome" } }));
methods["listProcessors"] = await attempt(() => client.listProcessors());
methods["getProcessor(id).details"] = await attempt(() => client.getProcessor("topic-guard").details());
const execute = (id, phase, messages, agentId) => attempt(() => client.getProcessor(id).execute({ phase, messages, agentId }));
methods["getProcessor(id).execute"] = await execute("topic-guard", "input", [user("m1", "hello")], "assistant");
probes.executeTripwire = await execute("topic-guard", "input", [user("m2", "a jailbreak")], "assistant");
probes.executeRewrite = await execute("pii-redactor", "input", [user("m3", "mail ada@example.com")]);
probes.executeOutputStream = await execute("word-filter", "outputStream", [user("m4", "x"), assistantSaid("m5", "darn it")], "assistant");
probes.executeOutputStreamNoText = await execute("word-filter", "outputStream", [user("m6", "x")]);
probes.executeToolResult = await execute("result-redactor", "toolResult", [toolDone("m7", { door: "open", secret: "1234" })]);
probes.executeOutputStep = await execute("length-check", "outputStep", [assistantSaid("m8", "one two three four five six seven eight nine ten eleven twelve thirteen")], "concise");
probes.executeWrongPhase = await execute("topic-guard", "outputStream", [assistantSaid("m9", "x")]);
probes.executeWorkflow = await execute("screen", "input", [user("m10", "hi")]);
methods["listWorkflows"] = await attempt(() => client.listWorkflows());
const wf = client.getWorkflow("screen");
methods["getWorkflow(id).details"] = await attempt(() => wf.details());
methods["getWorkflow(id).getSchema"] = await attempt(() => wf.getSchema());
methods["getWorkflow(id).runs"] = await attempt(() => wf.runs());
methods["getWorkflow(id).runById"] = await attempt(() => wf.runById("run-1"));
methods["getWorkflow(id).deleteRunById"] = await attempt(() => wf.deleteRunById("run-1"));
methods["getWorkflow(id).createRun"] = await attempt(() => wf.createRun());
methods["listWorkflowRunCounts"] = await attempt(() => client.listWorkflowRunCounts());
methods["listToolProviders"] = await attempt(() => client.listToolProviders());
const tp = client.getToolProvider("composio");
methods["getToolProvider(id).listToolkits"] = await attempt(() => tp.listToolkits());
methods["getToolProvider(id).listTools"] = await attempt(() => tp.listTools());
methods["getToolProvider(id).getToolSchema"] = await attempt(() => tp.getToolSchema("slug"));
methods["getToolProvider(id).authorize"] = await attempt(() => tp.authorize({ toolkit: "x" }));
methods["getToolProvider(id).getAuthStatus"] = await attempt(() => tp.getAuthStatus("auth-1"));
methods["getToolProvider(id).getConnectionStatus"] = await attempt(() => tp.getConnectionStatus({ toolkit: "x" }));
methods["getToolProvider(id).listConnections"] = await attempt(() => tp.listConnections({ toolkit: "x" }));
methods["getToolProvider(id).listConnectionFields"] = await attempt(() => tp.listConnectionFields({ toolkit: "x" }));
methods["getToolProvider(id).disconnectConnection"] = await attempt(() => tp.disconnectConnection("c1"));
methods["getToolProvider(id).updateConnection"] = await attempt(() => tp.updateConnection("c1", { name: "n" }));
methods["getToolProvider(id).getConnectionUsage"] = await attempt(() => tp.getConnectionUsage("c1"));
methods["getToolProvider(id).getHealth"] = await attempt(() => tp.getHealth());
methods["getProcessorProviders"] = await attempt(() => client.getProcessorProviders());
methods["getProcessorProvider(id).details"] = await attempt(() => client.getProcessorProvider("p").details());

// -- Agent: details, runs, tools ------------------------------------------------------------
methods["agent.details"] = await attempt(() => helper.details());
probes.detailsToolKeys = await attempt(async () => Object.keys((await helper.details()).tools));
probes.assistantDetails = await attempt(() => assistant.details());
methods["agent.generate"] = await attempt(async () => pick(await assistant.generate("hello")));
methods["agent.stream"] = await attempt(async () => chunksOf(await assistant.stream("hello")));
probes.perCallProcessors = await attempt(() => assistant.generate("hello", { inputProcessors: [{ id: "pii-redactor" }] }));
methods["agent.getTool"] = await attempt(() => helper.getTool("weather"));
probes.getToolMissing = await attempt(() => helper.getTool("nope"));
methods["agent.executeTool"] = await attempt(() => helper.executeTool("weather", { data: { city: "Oslo" } }));
probes.executeToolBadArgs = await attempt(() => helper.executeTool("weather", { data: { city: 7 } }));
probes.executeToolNeedsApproval = await attempt(() => helper.executeTool("vault", { data: {} }));

// tool approval: each run suspends at `weather` (every call needs approval in this call)
const approval = { requireToolApproval: true };
async function suspendStream() {
  const chunks = await chunksOf(await helper.stream(ASK, approval));
  const asked = chunks.find((c) => c.type === "tool-call-approval");
  return { runId: asked?.runId, toolCallId: asked?.payload?.toolCallId };
}
async function suspendGenerate() {
  const result = await helper.generate(ASK, approval);
  probes.suspendedGenerate = { runId: result.runId, status: result.status };
  // the ids alone: approve / decline refuse a key they do not take (status) with a 400
  return { runId: result.runId, toolCallId: result.suspendPayload?.toolCallId };
}
let ids = await suspendStream();
methods["agent.listSuspendedRuns"] = await attempt(() => helper.listSuspendedRuns());
probes.suspendedRunId = ids.runId;
methods["agent.approveToolCall"] = await attempt(async () => chunksOf(await helper.approveToolCall(ids)));
ids = await suspendStream();
methods["agent.declineToolCall"] = await attempt(async () => chunksOf(await helper.declineToolCall({ ...ids, reason: "not now" })));
ids = await suspendGenerate();
methods["agent.approveToolCallGenerate"] = await attempt(async () => pick(await helper.approveToolCallGenerate(ids)));
probes.approveAgain = await attempt(() => helper.approveToolCallGenerate(ids));
ids = await suspendGenerate();
methods["agent.declineToolCallGenerate"] = await attempt(async () => pick(await helper.declineToolCallGenerate({ ...ids, reason: "not now" })));
// resumeData {approved} answers a call awaiting approval (the reference's rule); a tool that
// suspends itself is resumed with its data (tests/e2e/service/test_replicas_suspend.py)
ids = await suspendStream();
methods["agent.resumeStream"] = await attempt(async () => chunksOf(await helper.resumeStream({ approved: true }, ids)));

// a durable run, observed again after it ended
const durable = await chunksOf(await assistant.stream("hello", { durable: true }));
probes.durableStream = durable;
methods["agent.observe"] = await attempt(async () => chunksOf(await assistant.observe({ runId: durable[0].runId })));

// what procmesh answers 501 (the error names the feature and why)
const agentMethods501 = {
  readPlan: () => assistant.readPlan(".mastracode/plans/p.md"),
  browserSession: () => assistant.browserSession(),
  closeBrowser: () => assistant.closeBrowser(),
  enhanceInstructions: () => assistant.enhanceInstructions("be nice", "shorter"),
  sendMessage: () => assistant.sendMessage({ message: "hi", resourceId: "r", threadId: "t" }),
  queueMessage: () => assistant.queueMessage({ message: "hi", resourceId: "r", threadId: "t" }),
  sendSignal: () => assistant.sendSignal({ signal: { type: "x" }, resourceId: "r", threadId: "t" }),
  subscribeToThread: () => assistant.subscribeToThread({ resourceId: "r", threadId: "t" }),
  abortThread: () => assistant.abortThread({ resourceId: "r", threadId: "t" }),
  clone: () => assistant.clone({ newId: "copy" }),
  listVersions: () => assistant.listVersions(),
  createVersion: () => assistant.createVersion({ changeMessage: "v2" }),
  getVersion: () => assistant.getVersion("v1"),
  activateVersion: () => assistant.activateVersion("v1"),
  restoreVersion: () => assistant.restoreVersion("v1"),
  deleteVersion: () => assistant.deleteVersion("v1"),
  compareVersions: () => assistant.compareVersions("v1", "v2"),
  generateLegacy: () => assistant.generateLegacy({ messages: "hi" }),
  streamLegacy: () => assistant.streamLegacy({ messages: "hi" }),
  network: () => assistant.network("hi", {}),
  approveNetworkToolCall: () => assistant.approveNetworkToolCall({ runId: "r", toolCallId: "c" }),
  declineNetworkToolCall: () => assistant.declineNetworkToolCall({ runId: "r", toolCallId: "c" }),
  streamUntilIdle: () => assistant.streamUntilIdle("hi"),
  sendToolApproval: () => assistant.sendToolApproval({ runId: "r", toolCallId: "c", approved: true }),
  resumeStreamUntilIdle: () => assistant.resumeStreamUntilIdle({ ok: true }, { runId: "r" }),
  recover: () => assistant.recover({ runId: "r" }),
  updateModel: () => assistant.updateModel({ modelId: "gpt-4o", provider: "openai" }),
  resetModel: () => assistant.resetModel(),
  updateModelInModelList: () => assistant.updateModelInModelList({ modelConfigId: "m1", enabled: false }),
  reorderModelList: () => assistant.reorderModelList({ reorderedModelIds: [] }),
  "voice.speak": () => assistant.voice.speak("hi"),
  "voice.listen": () => assistant.voice.listen(new Blob(["x"])),
  "voice.getSpeakers": () => assistant.voice.getSpeakers(),
  "voice.getListener": () => assistant.voice.getListener(),
};
for (const [name, call] of Object.entries(agentMethods501)) methods[`agent.${name}`] = await attempt(call);

console.log(JSON.stringify({ methods, probes }));
