// The client APIs besides agents, tools, processors and workflows, called as a user would
// (tests/e2e/service/test_clientjs_routes.py): MCP servers work, the rest answers 501 by name.
// usage: node apis.mjs BASE_URL API_KEY
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

console.log(JSON.stringify({
  getMcpServers: await attempt(() => client.getMcpServers()),
  getMcpServerDetails: await attempt(() => client.getMcpServerDetails("calc")),
  getMcpServerTools: await attempt(() => client.getMcpServerTools("calc")),
  listLogs: await attempt(() => client.listLogs({ transportId: "console" })),
  listScorers: await attempt(() => client.listScorers()),
  listTraces: await attempt(() => client.listTraces()),
  getTraces: await attempt(() => client.getTraces({})),
  agentCard: await attempt(() => client.getA2A("helper").getAgentCard()),
}));
