// The official `openai` JavaScript client against `quench serve`: chat whole and streamed,
// log-probabilities, completions, embeddings (the client asks for base64 and decodes
// them), tool calls whole and streamed, structured output, several choices, sampling
// fields and the error shape. run.sh starts the server and exports its address.
//
// QUENCH_URL, QUENCH_CHAT_MODEL, QUENCH_EMBED_MODEL, QUENCH_REAL_MODELS: as for the
// Python tests (conftest.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

function env(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run the server tests with tests/server/run.sh`);
  }
  return value;
}

const client = new OpenAI({ baseURL: env("QUENCH_URL"), apiKey: "unused", maxRetries: 0 });
const chatModel = env("QUENCH_CHAT_MODEL");
const embedModel = env("QUENCH_EMBED_MODEL");
const realModels = process.env.QUENCH_REAL_MODELS === "1";

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The current weather in a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 40 },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};

function ask(messages, extra = {}) {
  return client.chat.completions.create({
    model: chatModel,
    messages,
    max_tokens: 24,
    temperature: 0,
    ...extra,
  });
}

function checkWeatherCall(name, args) {
  assert.equal(name, "get_weather");
  const v = JSON.parse(args);
  assert.deepEqual(Object.keys(v).sort(), ["city", "unit"]);
  assert.ok(typeof v.city === "string" && v.city.length <= 40);
  assert.ok(["celsius", "fahrenheit"].includes(v.unit));
  return v;
}

test("models lists the chat and embedding models", async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    ids.push(m.id);
  }
  assert.ok(ids.includes(chatModel) && ids.includes(embedModel), ids.join(", "));
});

test("a chat answer whole and streamed is the same, with usage", async () => {
  const messages = [{ role: "user", content: "Tell me a short story about a robot." }];
  const whole = await ask(messages);
  const choice = whole.choices[0];
  assert.equal(whole.object, "chat.completion");
  assert.equal(choice.message.role, "assistant");
  assert.ok(choice.message.content.length > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  const stream = await ask(messages, { stream: true, stream_options: { include_usage: true } });
  let text = "";
  let pieces = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    usage = chunk.usage ?? usage;
    for (const c of chunk.choices) {
      if (c.delta.content) {
        text += c.delta.content;
        pieces += 1;
      }
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(pieces >= 2, "the answer came in one piece: not streamed");
  assert.equal(text, choice.message.content);
  assert.equal(finish, choice.finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  if (realModels) {
    const paris = await ask([{ role: "user", content: "What is the capital of France?" }]);
    assert.match(paris.choices[0].message.content, /Paris/);
  }
});

test("log-probabilities come with their alternatives", async () => {
  const r = await ask([{ role: "user", content: "Hi" }], {
    max_tokens: 5,
    logprobs: true,
    top_logprobs: 3,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const item of content) {
    assert.ok(item.logprob <= 0);
    assert.equal(item.top_logprobs.length, 3);
    const best = Math.max(...item.top_logprobs.map((t) => t.logprob));
    assert.ok(Math.abs(item.logprob - best) < 1e-5);
  }
});

test("completions whole and streamed; a seed repeats a sampled answer", async () => {
  const kw = { model: chatModel, prompt: "The quick brown fox", max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(kw);
  assert.equal(whole.object, "text_completion");
  let streamed = "";
  for await (const chunk of await client.completions.create({ ...kw, stream: true })) {
    streamed += chunk.choices[0]?.text ?? "";
  }
  assert.equal(streamed, whole.choices[0].text);
  const seeded = { ...kw, temperature: 1.2, top_p: 0.95, seed: 7 };
  const a = await client.completions.create(seeded);
  const b = await client.completions.create(seeded);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test("embeddings come back as base64 and as floats alike", async () => {
  const texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Interest rates rose again."];
  // The client asks for base64 unless told otherwise, and decodes it.
  const packed = await client.embeddings.create({ model: embedModel, input: texts });
  const floats = await client.embeddings.create({
    model: embedModel,
    input: texts,
    encoding_format: "float",
  });
  assert.equal(packed.data.length, 3);
  for (const [i, d] of packed.data.entries()) {
    const f = floats.data[i].embedding;
    assert.equal(d.embedding.length, f.length);
    assert.ok(d.embedding.every((x, j) => x === f[j]), "base64 and float vectors differ");
    const norm = Math.sqrt(f.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-4);
  }
  if (realModels) {
    const v = floats.data.map((d) => d.embedding);
    const cos = (a, b) => a.reduce((s, x, j) => s + x * b[j], 0);
    assert.ok(cos(v[0], v[1]) > cos(v[0], v[2]) + 0.2);
  }
});

test("a required tool call, whole and streamed", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris, in celsius?" }];
  const kw = { tools: [WEATHER], tool_choice: "required", parallel_tool_calls: false, max_tokens: 60 };
  const r = await ask(messages, kw);
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, "function");
  const args = checkWeatherCall(call.function.name, call.function.arguments);
  const parts = new Map();
  let finish = null;
  for await (const chunk of await ask(messages, { ...kw, stream: true })) {
    for (const c of chunk.choices) {
      for (const d of c.delta.tool_calls ?? []) {
        const p = parts.get(d.index) ?? { name: "", args: "" };
        p.name += d.function?.name ?? "";
        p.args += d.function?.arguments ?? "";
        parts.set(d.index, p);
      }
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(finish, "tool_calls");
  assert.deepEqual([...parts.keys()], [0]);
  assert.deepEqual(checkWeatherCall(parts.get(0).name, parts.get(0).args), args);
  // The result goes back as a tool message; without tools allowed the model answers in text.
  const after = await ask(
    [
      ...messages,
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature: 18 }) },
    ],
    { tools: [WEATHER], tool_choice: "none", max_tokens: 30 },
  );
  assert.ok(after.choices[0].message.content.length > 0);
  assert.ok(!after.choices[0].message.tool_calls?.length);
});

test("structured output follows its schema", async () => {
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 99 },
    },
    required: ["name", "age"],
    additionalProperties: false,
  };
  for (const temperature of [0, 0.8]) {
    const r = await ask([{ role: "user", content: "Invent a person as JSON." }], {
      max_tokens: 60,
      temperature,
      seed: 3,
      response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, "stop");
    const v = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(Object.keys(v).sort(), ["age", "name"]);
    assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 99);
    assert.ok(v.name.length <= 12);
  }
  const object = await ask([{ role: "user", content: "Give me a JSON object." }], {
    max_tokens: 40,
    response_format: { type: "json_object" },
  });
  if (object.choices[0].finish_reason === "stop") {
    assert.equal(typeof JSON.parse(object.choices[0].message.content), "object");
  }
});

test("several choices, each the answer of its own seed", async () => {
  const messages = [{ role: "user", content: "Name a colour." }];
  const kw = { max_tokens: 8, temperature: 1.0, seed: 11 };
  const r = await ask(messages, { ...kw, n: 3 });
  assert.deepEqual(
    r.choices.map((c) => c.index),
    [0, 1, 2],
  );
  for (let k = 0; k < 3; k++) {
    const alone = await ask(messages, { ...kw, seed: 11 + k });
    assert.equal(r.choices[k].message.content, alone.choices[0].message.content);
  }
});

test("sampling fields are honoured: logit_bias forces a token, top_k 1 is greedy", async () => {
  const root = env("QUENCH_URL").replace(/\/v1$/, "");
  const post = (path, body) =>
    fetch(`${root}${path}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: chatModel, ...body }),
    }).then((res) => res.json());
  const ids = (await post("/tokenize", { prompt: " Paris" })).tokens;
  const id = ids[ids.length - 1];
  const text = (await post("/detokenize", { tokens: [id] })).prompt;
  assert.ok(text.trim().length > 0, JSON.stringify({ ids, text }));
  const messages = [{ role: "user", content: "Say hello." }];
  const forced = await ask(messages, { max_tokens: 4, logit_bias: { [id]: 100 } });
  assert.ok(
    forced.choices[0].message.content.includes(text.trim()),
    `${JSON.stringify(forced.choices[0].message.content)} lacks ${JSON.stringify(text)}`,
  );
  // top_k, min_p and repetition_penalty go as extension fields; top_k 1 leaves one token.
  const plain = await ask(messages, { max_tokens: 6 });
  const extended = await ask(messages, { max_tokens: 6, temperature: 0.9, seed: 5, top_k: 1 });
  assert.equal(extended.choices[0].message.content, plain.choices[0].message.content);
});

test("bad requests are refused with OpenAI's error shape", async () => {
  await assert.rejects(
    ask([{ role: "user", content: "x" }], {
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "nowhere" } },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, "tool_choice.function.name");
      return true;
    },
  );
  await assert.rejects(
    client.completions.create({ model: chatModel, prompt: "x", max_tokens: 2, best_of: 3 }),
    (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, "unsupported_parameter");
      return true;
    },
  );
});
