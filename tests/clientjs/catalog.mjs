// The catalog through the real @mastra/client-js, unchanged: agent details, tools, processors,
// processor workflows, model providers, and every method of those APIs procmesh answers with 501.
// usage: node catalog.mjs BASE_URL API_KEY   (run by tests/e2e/service/test_clientjs_catalog.py)
// Prints one JSON object: per method, {ok: value} or {status, body} of the error it threw.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { status: error.status ?? null, body: error.body ?? String(error) };
  }
}

const out = {};
const assistant = client.getAgent("assistant");
const helper = client.getAgent("helper");

// served
out.listAgents = await attempt(() => client.listAgents());
out.details = await attempt(() => helper.details());
out.detailsToolKeys = await attempt(async () => Object.keys((await helper.details()).tools));
out.assistantDetails = await attempt(() => assistant.details());
out.agentGetTool = await attempt(() => helper.getTool("weather"));
out.agentGetToolMissing = await attempt(() => helper.getTool("nope"));
out.agentExecuteTool = await attempt(() => helper.executeTool("weather", { data: { city: "Oslo" } }));
out.agentExecuteToolBadArgs = await attempt(() => helper.executeTool("weather", { data: { city: 7 } }));
out.agentExecuteToolNeedsApproval = await attempt(() => helper.executeTool("vault", { data: {} }));
out.listTools = await attempt(() => client.listTools());
out.toolDetails = await attempt(() => client.getTool("weather").details());
out.toolExecute = await attempt(() => client.getTool("weather").execute({ data: { city: "Rome" } }));
out.listProcessors = await attempt(() => client.listProcessors());
out.processorDetails = await attempt(() => client.getProcessor("topic-guard").details());
const user = (id, text) => ({ id, role: "user", content: { format: 2, parts: [{ type: "text", text }] } });
out.processorExecutePass = await attempt(() =>
  client.getProcessor("topic-guard").execute({ phase: "input", messages: [user("m1", "hello")], agentId: "assistant" }),
);
out.processorExecuteTripwire = await attempt(() =>
  client.getProcessor("topic-guard").execute({ phase: "input", messages: [user("m2", "a jailbreak")], agentId: "assistant" }),
);
out.processorExecuteRewrite = await attempt(() =>
  client.getProcessor("pii-redactor").execute({ phase: "input", messages: [user("m3", "mail ada@example.com")] }),
);
out.processorExecuteStream = await attempt(() =>
  client.getProcessor("word-filter").execute({ phase: "outputStream", messages: [user("m4", "x")] }),
);
out.listWorkflows = await attempt(() => client.listWorkflows());
out.workflowDetails = await attempt(() => client.getWorkflow("screen").details());
out.workflowSchema = await attempt(() => client.getWorkflow("screen").getSchema());
out.providers = await attempt(() => client.listAgentsModelProviders());

// answered 501 (the error names the feature)
const wf = client.getWorkflow("screen");
const unsupported = {
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
  updateModel: () => assistant.updateModel({ modelId: "gpt-4o", provider: "openai" }),
  resetModel: () => assistant.resetModel(),
  updateModelInModelList: () => assistant.updateModelInModelList({ modelConfigId: "m1", enabled: false }),
  reorderModelList: () => assistant.reorderModelList({ reorderedModelIds: [] }),
  network: () => assistant.network("hi", {}),
  approveNetworkToolCall: () => assistant.approveNetworkToolCall({ runId: "r", toolCallId: "c" }),
  declineNetworkToolCall: () => assistant.declineNetworkToolCall({ runId: "r", toolCallId: "c" }),
  generateLegacy: () => assistant.generateLegacy({ messages: "hi" }),
  streamLegacy: () => assistant.streamLegacy({ messages: "hi" }),
  streamUntilIdle: () => assistant.streamUntilIdle("hi"),
  voiceSpeak: () => assistant.voice.speak("hi"),
  voiceListen: () => assistant.voice.listen(new Blob(["x"])),
  voiceGetSpeakers: () => assistant.voice.getSpeakers(),
  voiceGetListener: () => assistant.voice.getListener(),
  workflowRuns: () => wf.runs(),
  workflowRunById: () => wf.runById("run-1"),
  workflowDeleteRunById: () => wf.deleteRunById("run-1"),
  workflowCreateRun: () => wf.createRun(),
  listWorkflowRunCounts: () => client.listWorkflowRunCounts(),
  getProcessorProviders: () => client.getProcessorProviders(),
  processorProviderDetails: () => client.getProcessorProvider("p").details(),
  listToolProviders: () => client.listToolProviders(),
  toolProviderListTools: () => client.getToolProvider("p").listTools(),
};
out.unsupported = {};
for (const [name, call] of Object.entries(unsupported)) out.unsupported[name] = await attempt(call);

console.log(JSON.stringify(out));
