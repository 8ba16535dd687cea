// The generate / stream options and result fields of issue 20 with the real @mastra/client-js.
// usage: node options.mjs BASE_URL API_KEY   (run by tests/e2e/service/test_clientjs_options.py)
import { MastraClient } from "@mastra/client-js";
import { z } from "zod";

const [baseUrl, apiKey] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

async function streamed(agentId, messages, options) {
  const response = await client.getAgent(agentId).stream(messages, options);
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return chunks;
}

const pick = (r) => ({
  status: r.status, text: r.text, finishReason: r.finishReason, object: r.object, error: r.error,
  toolCalls: r.toolCalls, toolResults: r.toolResults, totalUsage: r.totalUsage, usage: r.usage,
  messages: r.messages, traceId: r.traceId, violations: r.violations, stepToolCalls: r.steps?.map((s) => s.toolCalls),
});

const out = {};
const Weather = z.object({ city: z.string(), temp: z.number() });
out.structured = pick(await client.getAgent("json").generate("weather?", { structuredOutput: { schema: Weather } }));
out.strict = pick(await client.getAgent("prose").generate("weather?", { structuredOutput: { schema: Weather } }));
out.structuredStream = await streamed("json", "weather?", { structuredOutput: { schema: Weather } });
out.injected = pick(await client.getAgent("json").generate("weather?", {
  structuredOutput: { schema: Weather, jsonPromptInjection: true },
}));
out.options = pick(await client.getAgent("assistant").generate("hello", {
  modelSettings: { temperature: 0.1, maxOutputTokens: 200, topP: 0.5 },
  toolChoice: "none",
  activeTools: [],
  instructions: "Be short.",
}));
out.image = pick(await client.getAgent("assistant").generate([
  { role: "user", content: [{ type: "text", text: "what is this?" }, { type: "image", image: PNG, mimeType: "image/png" }] },
]));
out.tools = pick(await client.getAgent("tools").generate("What is the weather in Paris?"));
out.guarded = pick(await client.getAgent("assistant").generate("please jailbreak"));
out.guardedStream = await streamed("assistant", "please jailbreak");
async function refused(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { status: error.status, body: error.body };
  }
}
out.badSetting = await refused(() => client.getAgent("assistant").generate("hello", { modelSettings: { temprature: 1 } }));

// Per-call processor lists (the server trusts its callers): they replace the agent's lanes. A
// processor object goes as JSON, its methods dropped: the id names a processor a sidecar hosts.
class Redactor {
  constructor() { this.id = "pii-redactor"; this.name = "my redactor"; }
  async processInput({ messages }) { return messages; }
}
out.noProcessors = pick(await client.getAgent("assistant").generate("please jailbreak", { inputProcessors: [], outputProcessors: [] }));
out.redacting = pick(await client.getAgent("assistant").generate("mail ada@example.com", { inputProcessors: [new Redactor()] }));
out.redactingStream = await streamed("assistant", "mail ada@example.com", { inputProcessors: ["pii-redactor"], outputProcessors: [] });
out.workflowLane = pick(await client.getAgent("assistant").generate("mail ada@example.com", { inputProcessors: ["redact"], outputProcessors: [] }));
out.workflowErrorLane = await refused(() => client.getAgent("assistant").generate("hi", { errorProcessors: ["workflow:redact"] }));
out.unknownProcessor = await refused(() => client.getAgent("assistant").generate("hi", { inputProcessors: [{ id: "nope" }] }));
out.codeProcessor = await refused(() => client.getAgent("assistant").generate("hi", { outputProcessors: [{ processOutputResult: () => [] }] }));
process.stdout.write(JSON.stringify(out));
