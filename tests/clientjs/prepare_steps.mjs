// prepareSteps (SEED-GAPS B28), the declarative prepareStep, with the real @mastra/client-js: the
// client sends whatever options it is given in the body, so a caller writes the rules as options.
// usage: node prepare_steps.mjs BASE_URL API_KEY CASE   (run by tests/e2e/service/test_prepare_steps.py)
import { MastraClient } from "@mastra/client-js";

const [baseUrl, apiKey, name] = process.argv.slice(2);
const client = new MastraClient({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` }, retries: 0 });
const agent = client.getAgent("a");

async function refused(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { status: error.status, body: error.body };
  }
}

const cases = {
  // step 1 and after: another model, no tool calls
  switched: async () => {
    const r = await agent.generate("weather in Paris?", {
      prepareSteps: [{ when: { fromStepNumber: 1 }, override: { model: "local/small", toolChoice: "none" } }],
    });
    return { status: r.status, text: r.text };
  },
  // streamed: step 0 offers one tool, under another system message
  narrowed: async () => {
    const response = await agent.stream("weather in Paris?", {
      prepareSteps: [{ when: { stepNumber: 0 }, override: { activeTools: ["weather"], system: "Be brief." } }],
    });
    let text = "";
    await response.processDataStream({
      onChunk: async (chunk) => { if (chunk.type === "text-delta") text += chunk.payload.text; },
    });
    return { text };
  },
  unknownKey: () => refused(() => agent.generate("hi", {
    prepareSteps: [{ when: { stepNumber: 0 }, override: { model: "local/small", colour: "red" } }],
  })),
  unknownModel: () => refused(() => agent.generate("hi", {
    prepareSteps: [{ when: { stepNumber: 1 }, override: { model: "nowhere" } }],
  })),
};

console.log(JSON.stringify(await cases[name]()));
