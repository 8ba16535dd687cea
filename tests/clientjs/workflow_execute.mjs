// A processor workflow executed through @mastra/client-js 1.47's getProcessor(id).execute(), as an
// operator and as a tenant (tests/e2e/service/test_clientjs_workflow_execute.py).
// usage: node workflow_execute.mjs BASE_URL OPERATOR_KEY TENANT_KEY
// Prints {name: {ok: value} | {status, body}} for each call.
import { MastraClient } from "@mastra/client-js";

const [baseUrl, operatorKey, tenantKey] = process.argv.slice(2);
const clientFor = (key) => new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${key}` }, retries: 0 });
const operator = clientFor(operatorKey);
const tenant = clientFor(tenantKey);

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { status: error.status ?? null, body: error.body ?? String(error) };
  }
}

const user = (id, text) => ({ id, role: "user", content: { format: 2, parts: [{ type: "text", text }] } });
const assistantSaid = (id, text) => ({ id, role: "assistant", content: { format: 2, parts: [{ type: "text", text }] } });
const run = (client, id, params) => attempt(() => client.getProcessor(id).execute(params));

const out = {};
out.details = await attempt(() => operator.getProcessor("screen").details());
out.listed = await attempt(() => operator.listProcessors());
out.passes = await run(operator, "screen", { phase: "input", messages: [user("m1", "mail jane@example.com")] });
out.nestedAbort = await run(operator, "screen", {
  phase: "input", messages: [user("m2", "jailbreak, then mail jane@example.com")],
});
out.tenantAbort = await run(tenant, "screen", { phase: "input", messages: [user("m3", "a refund please")] });
out.operatorNoBranch = await run(operator, "screen", { phase: "input", messages: [user("m4", "a refund please")] });
out.withContext = await run(operator, "concise", {
  phase: "outputStep", messages: [assistantSaid("m5", "one two three four five six")],
  requestContext: { maxWords: 3 },
});
out.badContext = await run(operator, "concise", {
  phase: "outputStep", messages: [assistantSaid("m10", "one")], requestContext: { maxWords: "many" },
});
out.uncaught = await run(operator, "broken", { phase: "input", messages: [user("m6", "hello")] });
out.missingPhase = await run(operator, "screen", { phase: "outputStream", messages: [assistantSaid("m7", "x")] });
out.tenantReserved = await run(tenant, "screen", {
  phase: "input", messages: [user("m8", "hi")], requestContext: { resourceId: "other" },
});
out.unknownAgent = await run(operator, "screen", { phase: "input", messages: [user("m9", "hi")], agentId: "nobody" });
console.log(JSON.stringify(out));
