// The official `openai` npm package as a client of `pincer gateway` (run by crates/pincer/tests/openai_api_external.rs).
// Env: PINCER_OPENAI_BASE_URL (http://host:port/v1), PINCER_TOKEN, PINCER_PREFIX. Asserts what the client
// sees and prints one JSON line for the Rust test to compare with the transcript and the fake.
import assert from "node:assert/strict";
import OpenAI from "openai";

const { PINCER_OPENAI_BASE_URL: baseURL, PINCER_TOKEN: apiKey, PINCER_PREFIX: prefix } = process.env;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const ids = [];
for await (const m of client.models.list()) ids.push(m.id);
assert.ok(ids.includes("pincer") && ids.includes("fake/fake-model"), ids.join(","));

await assert.rejects(
  new OpenAI({ baseURL, apiKey: "wrong-key-0123456789", maxRetries: 0 }).chat.completions.create({
    model: "pincer", messages: [{ role: "user", content: "never stored" }] }),
  (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 && e.code === "invalid_api_key",
);

// Open WebUI's way: the whole history every turn.
const history = [{ role: "system", content: "Be brief." }];
const replies = [];
for (let n = 1; n <= 3; n++) {
  history.push({ role: "user", content: `${prefix} turn ${n}` });
  const r = await client.chat.completions.create({ model: "pincer", messages: history });
  const text = r.choices[0].message.content;
  assert.equal(text, `Fake reply: you said "${prefix} turn ${n}"`);
  assert.equal(r.choices[0].finish_reason, "stop");
  replies.push({ text, usage: r.usage });
  history.push({ role: "assistant", content: text });
}

history.push({ role: "user", content: `${prefix} streamed` });
const stream = await client.chat.completions.create({
  model: "fake/fake-model", messages: history, stream: true, stream_options: { include_usage: true } });
let text = "", finish = null, usage = null;
for await (const chunk of stream) {
  assert.equal(chunk.object, "chat.completion.chunk");
  if (chunk.choices.length) {
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  } else if (chunk.usage) {
    usage = chunk.usage;
  }
}
assert.equal(text, `Fake reply: you said "${prefix} streamed"`);
assert.equal(finish, "stop");
assert.ok(usage, "a usage chunk");
replies.push({ text, usage });

// Client tools (function calling): the model's call comes back (whole this time); the client runs it and
// sends the result; the turn goes on.
const tools = [{ type: "function", function: { name: "lookup", description: "Look a word up.",
  parameters: { type: "object", properties: { query: { type: "string" } }, required: ["query"] } } }];
const convo = [{ role: "user", content: `${prefix} tools [call:lookup]` }];
const asked = await client.chat.completions.create({ model: "pincer", messages: convo, tools });
assert.equal(asked.choices[0].finish_reason, "tool_calls");
const [call] = asked.choices[0].message.tool_calls;
assert.equal(call.function.name, "lookup");
assert.deepEqual(JSON.parse(call.function.arguments), { query: "lookup" });
convo.push(asked.choices[0].message);
convo.push({ role: "tool", tool_call_id: call.id, content: `${prefix} looked up` });
const done = await client.chat.completions.create({ model: "pincer", messages: convo, tools });
assert.equal(done.choices[0].finish_reason, "stop");
assert.equal(done.choices[0].message.content, `Fake reply: you said "${prefix} tools [call:lookup]"`);
console.log(JSON.stringify({ replies, tool_call: call.id }));
