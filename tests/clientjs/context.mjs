// A request context from the real @mastra/client-js, on generate and stream (issue 26).
// usage: node context.mjs BASE_URL TRUSTED_KEY UNTRUSTED_KEY   (run by tests/e2e/service/test_clientjs_context.py)
// The first key's caller may send `tenant`, the second's nothing: its context is refused, never dropped.
import { MastraClient, RequestContext } from "@mastra/client-js";

const [baseUrl, trustedKey, untrustedKey] = process.argv.slice(2);
const client = (key) => new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${key}` }, retries: 0 });

async function streamed(agent, options) {
  const response = await agent.stream("hello", options);
  const chunks = [];
  await response.processDataStream({ onChunk: async (chunk) => { chunks.push(chunk); } });
  return { runId: chunks.find((c) => c.runId)?.runId, types: chunks.map((c) => c.type) };
}

async function refused(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { status: error.status, body: error.body };
  }
}

const trusted = client(trustedKey).getAgent("witnessed");
const untrusted = client(untrustedKey).getAgent("witnessed");
const asObject = { tenant: "acme" };
const asInstance = new RequestContext([["tenant", "globex"]]);
const out = {};
const generated = await trusted.generate("hello", { requestContext: asObject });
out.generate = { runId: generated.runId, status: generated.status };
out.generateInstance = { runId: (await trusted.generate("hello", { requestContext: asInstance })).runId };
out.stream = await streamed(trusted, { requestContext: asObject });
out.streamInstance = await streamed(trusted, { requestContext: asInstance });
out.refusedGenerate = await refused(() => untrusted.generate("hello", { requestContext: asObject }));
out.refusedStream = await refused(() => streamed(untrusted, { requestContext: asObject }));
out.none = (await untrusted.generate("hello")).status;
process.stdout.write(JSON.stringify(out));
