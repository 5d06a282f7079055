"""The official `openai` Python package as a client of `pincer gateway` (run by crates/pincer/tests/openai_api_external.rs).

Env: PINCER_OPENAI_BASE_URL (http://host:port/v1), PINCER_TOKEN, PINCER_PREFIX (makes this run's texts unique).
Asserts what the client sees and prints one JSON line for the Rust test to compare with the transcript and the fake.
"""
import json
import os
import sys

import openai

base, token, prefix = os.environ["PINCER_OPENAI_BASE_URL"], os.environ["PINCER_TOKEN"], os.environ["PINCER_PREFIX"]
client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)

ids = [m.id for m in client.models.list().data]
assert "pincer" in ids and "fake/fake-model" in ids, ids

try:
    openai.OpenAI(base_url=base, api_key="wrong-key-0123456789", max_retries=0).chat.completions.create(
        model="pincer", messages=[{"role": "user", "content": "never stored"}])
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e.status_code
    assert e.body["code"] == "invalid_api_key" and e.body["type"] == "invalid_request_error", e.body

# Open WebUI's way: the whole history every turn.
history = [{"role": "system", "content": "Be brief."}]
replies = []
for n in range(1, 4):
    history.append({"role": "user", "content": f"{prefix} turn {n}"})
    r = client.chat.completions.create(model="pincer", messages=history)
    text = r.choices[0].message.content
    assert text == f'Fake reply: you said "{prefix} turn {n}"', text
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "stop", r
    replies.append({"text": text, "usage": r.usage.model_dump(exclude_none=True)})
    history.append({"role": "assistant", "content": text})

history.append({"role": "user", "content": f"{prefix} streamed"})
stream = client.chat.completions.create(model="fake/fake-model", messages=history, stream=True,
                                        stream_options={"include_usage": True})
pieces, finish, usage = [], None, None
for chunk in stream:
    assert chunk.object == "chat.completion.chunk", chunk
    if chunk.choices:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    elif chunk.usage is not None:
        usage = chunk.usage.model_dump(exclude_none=True)
text = "".join(pieces)
assert text == f'Fake reply: you said "{prefix} streamed"', text
assert finish == "stop" and usage is not None, (finish, usage)
replies.append({"text": text, "usage": usage})

# Client tools (function calling, as LangChain's bind_tools and the Agents SDK use it): the model's call
# comes back streamed; the client runs it and sends the result; the turn goes on.
tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
convo = [{"role": "user", "content": f"{prefix} tools [call:lookup]"}]
calls, finish = {}, None
for chunk in client.chat.completions.create(model="pincer", messages=convo, tools=tools, stream=True):
    for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
        c = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
        c["arguments"] += d.function.arguments or ""
    if chunk.choices:
        finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
call = calls[0]
assert call["name"] == "lookup" and json.loads(call["arguments"]) == {"query": "lookup"}, call
convo.append({"role": "assistant", "content": None, "tool_calls": [
    {"id": call["id"], "type": "function", "function": {"name": "lookup", "arguments": call["arguments"]}}]})
convo.append({"role": "tool", "tool_call_id": call["id"], "content": f"{prefix} looked up"})
r = client.chat.completions.create(model="pincer", messages=convo, tools=tools)
assert r.choices[0].finish_reason == "stop", r
assert r.choices[0].message.content == f'Fake reply: you said "{prefix} tools [call:lookup]"', r
print(json.dumps({"replies": replies, "tool_call": call["id"]}))
sys.stdout.flush()
