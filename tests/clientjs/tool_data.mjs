// What tools write and processors add, read by the real @mastra/client-js (SEED-GAPS H6, H8).
// usage: node tool_data.mjs BASE_URL   (run by tests/e2e/service/test_clientjs_tool_data.py)
// - stream "tooled": every chunk's type and data (data-* chunks from a Python and a Node hosted
//   tool's writer and an MCP tool's progress, between the tool-result chunks);
// - generate "stamped": result.response.uiMessages, where a processOutputResult hook's metadata is.
import { MastraClient } from "@mastra/client-js";

const [baseUrl] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, retries: 0 });
const out = {};
const response = await client.getAgent("tooled").stream("go");
const chunks = [];
await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
out.stream = chunks
  .filter((c) => c.type.startsWith("data-") || c.type === "tool-result")
  .map((c) => (c.type === "tool-result" ? [c.type, c.payload.toolName, c.payload.result] : [c.type, c.data]));
const generated = await client.getAgent("stamped").generate("hello");
out.uiMessages = generated.response.uiMessages;
const assistant = generated.response?.uiMessages?.find((m) => m.role === "assistant");
out.customData = assistant?.metadata?.customData ?? null;
process.stdout.write(JSON.stringify(out));
