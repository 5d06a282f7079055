// The official `openai` npm package's Responses API (`client.responses`) as a client of `pincer gateway`
// (run by crates/pincer/tests/openai_responses_external.rs). Env: PINCER_OPENAI_BASE_URL (http://host:port/v1),
// PINCER_TOKEN, PINCER_PREFIX. Asserts what the client sees and prints one JSON line for the Rust test.
import assert from "node:assert/strict";
import OpenAI from "openai";

const { PINCER_OPENAI_BASE_URL: baseURL, PINCER_TOKEN: apiKey, PINCER_PREFIX: prefix } = process.env;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const reply = (said) => `Fake reply: you said "${said}"`;

// A plain response, with instructions and metadata.
const r1 = await client.responses.create({ model: "pincer", input: `${prefix} one`, instructions: "Be brief.",
  metadata: { k: "v" } });
assert.equal(r1.object, "response");
assert.equal(r1.status, "completed");
assert.equal(r1.output_text, reply(`${prefix} one`));
assert.equal(r1.usage.output_tokens, 7);
assert.deepEqual(r1.metadata, { k: "v" });

// Streamed, continuing r1.
const events = [];
for await (const e of await client.responses.create({ model: "pincer", input: `${prefix} two`,
  previous_response_id: r1.id, stream: true })) events.push(e);
const kinds = events.map((e) => e.type);
assert.deepEqual(events.map((e) => e.sequence_number), [...kinds.keys()]);
assert.deepEqual(kinds.slice(0, 4), ["response.created", "response.in_progress", "response.output_item.added",
  "response.content_part.added"]);
assert.deepEqual(kinds.slice(-4), ["response.output_text.done", "response.content_part.done",
  "response.output_item.done", "response.completed"]);
const deltas = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
assert.equal(deltas, reply(`${prefix} two`));
const r2 = events.at(-1).response;
assert.equal(r2.previous_response_id, r1.id);
assert.equal(r2.id, events[0].response.id);

// The stream helper, continuing r2.
const r3 = await client.responses.stream({ model: "pincer", input: `${prefix} three`,
  previous_response_id: r2.id }).finalResponse();
assert.equal(r3.output_text, reply(`${prefix} three`));

// A branch: continuing from r1 again.
const r4 = await client.responses.create({ model: "pincer", input: `${prefix} branch`, previous_response_id: r1.id });
assert.equal(r4.output_text, reply(`${prefix} branch`));

// Retrieval by id.
const got = await client.responses.retrieve(r2.id);
assert.equal(got.id, r2.id);
assert.equal(got.output_text, reply(`${prefix} two`));

// A client function tool, streamed: the call comes back, its output goes on from it.
const tools = [{ type: "function", name: "lookup", description: "Look a word up.", strict: false,
  parameters: { type: "object", properties: { query: { type: "string" } }, required: ["query"] } }];
const t1 = await client.responses.stream({ model: "pincer", input: `${prefix} tools [call:lookup]`, tools })
  .finalResponse();
const calls = t1.output.filter((o) => o.type === "function_call");
assert.equal(calls.length, 1);
assert.equal(calls[0].name, "lookup");
assert.deepEqual(JSON.parse(calls[0].arguments), { query: "lookup" });
const t2 = await client.responses.create({ model: "pincer", previous_response_id: t1.id, tools,
  input: [{ type: "function_call_output", call_id: calls[0].call_id, output: `${prefix} looked up` }] });
assert.equal(t2.output_text, reply(`${prefix} tools [call:lookup]`));

// Errors, and an unstored response.
await assert.rejects(
  client.responses.create({ model: "pincer", input: "x", previous_response_id: "resp_nope_oai-b00-1" }),
  (e) => e instanceof OpenAI.NotFoundError && /previous_response_id/.test(e.message),
);
await assert.rejects(
  client.responses.create({ model: "pincer", input: [{ type: "message", role: "wizard", content: "x" }] }),
  (e) => e instanceof OpenAI.BadRequestError && /input\[0\]\.role/.test(e.message),
);
const u = await client.responses.create({ model: "pincer", input: `${prefix} unstored`, store: false });
assert.equal(u.output_text, reply(`${prefix} unstored`));
await assert.rejects(client.responses.retrieve(u.id), (e) => e instanceof OpenAI.NotFoundError);

console.log(JSON.stringify({ r1: r1.id, r2: r2.id, r3: r3.id, r4: r4.id, t1: t1.id, t2: t2.id,
  call_id: calls[0].call_id, kinds }));
