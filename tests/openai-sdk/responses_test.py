"""The official `openai` Python package's Responses API (`client.responses`) as a client of `pincer gateway`
(run by crates/pincer/tests/openai_responses_external.rs).

Env: PINCER_OPENAI_BASE_URL (http://host:port/v1), PINCER_TOKEN, PINCER_PREFIX (makes this run's texts unique).
Asserts what the client sees and prints one JSON line for the Rust test to compare with the transcript.
"""
import json
import os

import openai
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

base, token, prefix = os.environ["PINCER_OPENAI_BASE_URL"], os.environ["PINCER_TOKEN"], os.environ["PINCER_PREFIX"]
client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)


def strict(kind, obj):
    """Validates what the server sent (the SDK builds its objects without checking) against the SDK's types."""
    TypeAdapter(kind).validate_python(obj.to_dict())


def reply(said):
    return f'Fake reply: you said "{said}"'


# A plain response, with instructions and metadata.
r1 = client.responses.create(model="pincer", input=f"{prefix} one", instructions="Be brief.", metadata={"k": "v"})
assert r1.object == "response" and r1.status == "completed", r1
assert r1.output_text == reply(f"{prefix} one"), r1.output_text
assert r1.output[0].type == "message" and r1.output[0].role == "assistant", r1.output
assert r1.usage.input_tokens > 0 and r1.usage.output_tokens == 7, r1.usage
assert r1.usage.total_tokens == r1.usage.input_tokens + 7, r1.usage
assert r1.metadata == {"k": "v"} and r1.instructions == "Be brief.", r1
strict(Response, r1)

# Streamed, continuing r1.
events = list(client.responses.create(model="pincer", input=f"{prefix} two", previous_response_id=r1.id, stream=True))
kinds = [e.type for e in events]
for e in events:
    strict(ResponseStreamEvent, e)
assert [e.sequence_number for e in events] == list(range(len(events))), kinds
assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"], kinds
assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                      "response.completed"], kinds
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert deltas == reply(f"{prefix} two"), deltas
r2 = events[-1].response
assert r2.output_text == deltas and r2.previous_response_id == r1.id and r2.id == events[0].response.id, r2
assert events[-2].item.content[0].text == deltas, events[-2]

# The stream helper (accumulates the events into the final response).
with client.responses.stream(model="pincer", input=f"{prefix} three", previous_response_id=r2.id) as s:
    r3 = s.get_final_response()
assert r3.output_text == reply(f"{prefix} three"), r3

# A branch: continuing from r1 again.
r4 = client.responses.create(model="pincer", input=f"{prefix} branch", previous_response_id=r1.id)
assert r4.output_text == reply(f"{prefix} branch"), r4

# Retrieval by id.
got = client.responses.retrieve(r2.id)
assert got.id == r2.id and got.output_text == r2.output_text and got.status == "completed", got
strict(Response, got)

# A client function tool: the call comes back, its output goes on from it.
tools = [{"type": "function", "name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
tool_events = list(client.responses.create(model="pincer", input=f"{prefix} tools [call:lookup]", tools=tools,
                                           stream=True))
for e in tool_events:
    strict(ResponseStreamEvent, e)
assert [e.type for e in tool_events] == [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
    "response.completed"], tool_events
t1 = tool_events[-1].response
calls = [o for o in t1.output if o.type == "function_call"]
strict(Response, t1)
assert len(calls) == 1 and calls[0].name == "lookup" and json.loads(calls[0].arguments) == {"query": "lookup"}, t1.output
t2 = client.responses.create(model="pincer", previous_response_id=t1.id, tools=tools, input=[
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": f"{prefix} looked up"}])
assert t2.output_text == reply(f"{prefix} tools [call:lookup]"), t2
assert client.responses.retrieve(t2.id).output_text == t2.output_text  # a turn with no user row, found again

# Errors: an unknown previous response, bad input; an unstored response cannot be retrieved.
try:
    client.responses.create(model="pincer", input="x", previous_response_id="resp_nope_oai-b00-1")
    raise AssertionError("an unknown previous_response_id was accepted")
except openai.NotFoundError as e:
    assert "previous_response_id" in e.body["message"], e.body
try:
    client.responses.create(model="pincer", input=[{"type": "message", "role": "wizard", "content": "x"}])
    raise AssertionError("a bad role was accepted")
except openai.BadRequestError as e:
    assert e.body["message"].startswith("input[0].role"), e.body
u = client.responses.create(model="pincer", input=f"{prefix} unstored", store=False)
assert u.output_text == reply(f"{prefix} unstored") and u.store is False, u
try:
    client.responses.retrieve(u.id)
    raise AssertionError("an unstored response was retrieved")
except openai.NotFoundError:
    pass

print(json.dumps({"r1": r1.id, "r2": r2.id, "r3": r3.id, "r4": r4.id, "t1": t1.id, "t2": t2.id,
                  "call_id": calls[0].call_id, "kinds": kinds}))
