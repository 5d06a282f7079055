//! Scripted model turns rendered in each provider's exact streaming wire format: one description of
//! a turn (thinking, text, tool calls, usage, how it ends) gives the SSE events OpenAI chat
//! completions, OpenAI Responses or Anthropic Messages would send for it.

use super::Format;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub enum Part {
    Thinking { chunks: Vec<String>, signature: String },
    Text(Vec<String>),
    ToolCall { id: String, name: String, arg_chunks: Vec<String> },
}

pub fn text(chunks: &[&str]) -> Part {
    Part::Text(chunks.iter().map(|s| (*s).to_owned()).collect())
}
pub fn thinking(chunks: &[&str], signature: &str) -> Part {
    Part::Thinking { chunks: chunks.iter().map(|s| (*s).to_owned()).collect(), signature: signature.to_owned() }
}
pub fn tool_call(id: &str, name: &str, arg_chunks: &[&str]) -> Part {
    Part::ToolCall {
        id: id.into(),
        name: name.into(),
        arg_chunks: arg_chunks.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Stop,
    Length,
    ToolUse,
}

#[derive(Debug, Clone)]
pub struct Turn {
    pub parts: Vec<Part>,
    /// (uncached input, output, cache read)
    pub usage: (u64, u64, u64),
    pub end: End,
}

pub fn turn(parts: Vec<Part>, usage: (u64, u64, u64)) -> Turn {
    let end = if parts.iter().any(|p| matches!(p, Part::ToolCall { .. })) { End::ToolUse } else { End::Stop };
    Turn { parts, usage, end }
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The events of a whole turn, one string per SSE event.
pub fn script(format: Format, t: &Turn) -> Vec<String> {
    match format {
        Format::OpenaiCompletions => script_chat(t),
        Format::OpenaiResponses => script_responses(t),
        Format::Anthropic => script_anthropic(t),
    }
}

fn chat_chunk(delta: Value, finish: Value) -> String {
    sse(
        None,
        &json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test",
                "choices":[{"index":0,"delta":delta,"logprobs":null,"finish_reason":finish}]}),
    )
}

fn script_chat(t: &Turn) -> Vec<String> {
    let mut out = vec![chat_chunk(json!({"role":"assistant","content":""}), Value::Null)];
    let mut tool_index = 0;
    for p in &t.parts {
        match p {
            Part::Thinking { chunks, .. } => {
                out.extend(chunks.iter().map(|c| chat_chunk(json!({"reasoning_content": c}), Value::Null)));
            }
            Part::Text(chunks) => out.extend(chunks.iter().map(|c| chat_chunk(json!({"content": c}), Value::Null))),
            Part::ToolCall { id, name, arg_chunks } => {
                out.push(chat_chunk(
                    json!({"tool_calls":[{"index":tool_index,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}),
                    Value::Null,
                ));
                out.extend(arg_chunks.iter().map(|c| {
                    chat_chunk(json!({"tool_calls":[{"index":tool_index,"function":{"arguments":c}}]}), Value::Null)
                }));
                tool_index += 1;
            }
        }
    }
    let finish = match t.end {
        End::Stop => "stop",
        End::Length => "length",
        End::ToolUse => "tool_calls",
    };
    out.push(chat_chunk(json!({}), json!(finish)));
    let (input, output, cached) = t.usage;
    out.push(sse(
        None,
        &json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test","choices":[],
                "usage":{"prompt_tokens":input+cached,"completion_tokens":output,"total_tokens":input+cached+output,
                         "prompt_tokens_details":{"cached_tokens":cached}}}),
    ));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

fn resp(data: Value) -> String {
    let ty = data["type"].as_str().unwrap_or_default().to_owned();
    sse(Some(&ty), &data)
}

fn script_responses(t: &Turn) -> Vec<String> {
    let mut out = vec![resp(json!({"type":"response.created","sequence_number":0,
        "response":{"id":"resp_1","object":"response","status":"in_progress","model":"gpt-resp-test","output":[],"usage":null}}))];
    let mut items = Vec::new();
    for (oi, p) in t.parts.iter().enumerate() {
        match p {
            Part::Thinking { chunks, signature } => {
                let id = format!("rs_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":id,"type":"reasoning","summary":[]}})));
                for c in chunks {
                    out.push(resp(json!({"type":"response.reasoning_summary_text.delta","item_id":id,"output_index":oi,"summary_index":0,"delta":c})));
                }
                let item = json!({"id":id,"type":"reasoning","summary":[{"type":"summary_text","text":chunks.concat()}],"encrypted_content":signature});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
            Part::Text(chunks) => {
                let id = format!("msg_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":id,"type":"message","status":"in_progress","role":"assistant","content":[]}})));
                out.push(resp(
                    json!({"type":"response.content_part.added","item_id":id,"output_index":oi,"content_index":0,
                    "part":{"type":"output_text","text":"","annotations":[]}}),
                ));
                for c in chunks {
                    out.push(resp(json!({"type":"response.output_text.delta","item_id":id,"output_index":oi,"content_index":0,"delta":c})));
                }
                out.push(resp(json!({"type":"response.output_text.done","item_id":id,"output_index":oi,"content_index":0,"text":chunks.concat()})));
                let item = json!({"id":id,"type":"message","status":"completed","role":"assistant",
                    "content":[{"type":"output_text","text":chunks.concat(),"annotations":[]}]});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
            Part::ToolCall { id, name, arg_chunks } => {
                let item_id = format!("fc_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":item_id,"type":"function_call","status":"in_progress","call_id":id,"name":name,"arguments":""}})));
                for c in arg_chunks {
                    out.push(resp(json!({"type":"response.function_call_arguments.delta","item_id":item_id,"output_index":oi,"delta":c})));
                }
                out.push(resp(json!({"type":"response.function_call_arguments.done","item_id":item_id,"output_index":oi,"arguments":arg_chunks.concat()})));
                let item = json!({"id":item_id,"type":"function_call","status":"completed","call_id":id,"name":name,"arguments":arg_chunks.concat()});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
        }
    }
    let (input, output, cached) = t.usage;
    let usage = json!({"input_tokens":input+cached,"input_tokens_details":{"cached_tokens":cached},
        "output_tokens":output,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":input+cached+output});
    let (ty, status, details) = match t.end {
        End::Length => ("response.incomplete", "incomplete", json!({"reason":"max_output_tokens"})),
        End::Stop | End::ToolUse => ("response.completed", "completed", Value::Null),
    };
    out.push(resp(
        json!({"type":ty,"response":{"id":"resp_1","object":"response","status":status,"model":"gpt-resp-test",
        "incomplete_details":details,"output":items,"usage":usage}}),
    ));
    out
}

fn ant(data: Value) -> String {
    let ty = data["type"].as_str().unwrap_or_default().to_owned();
    sse(Some(&ty), &data)
}

fn script_anthropic(t: &Turn) -> Vec<String> {
    let (input, output, cached) = t.usage;
    let mut out = vec![ant(json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",
        "content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,
        "usage":{"input_tokens":input,"cache_creation_input_tokens":0,"cache_read_input_tokens":cached,"output_tokens":1}}}))];
    out.push("event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned());
    for (i, p) in t.parts.iter().enumerate() {
        match p {
            Part::Thinking { chunks, signature } => {
                out.push(ant(
                    json!({"type":"content_block_start","index":i,"content_block":{"type":"thinking","thinking":""}}),
                ));
                for c in chunks {
                    out.push(ant(
                        json!({"type":"content_block_delta","index":i,"delta":{"type":"thinking_delta","thinking":c}}),
                    ));
                }
                out.push(ant(json!({"type":"content_block_delta","index":i,"delta":{"type":"signature_delta","signature":signature}})));
            }
            Part::Text(chunks) => {
                out.push(ant(
                    json!({"type":"content_block_start","index":i,"content_block":{"type":"text","text":""}}),
                ));
                for c in chunks {
                    out.push(ant(
                        json!({"type":"content_block_delta","index":i,"delta":{"type":"text_delta","text":c}}),
                    ));
                }
            }
            Part::ToolCall { id, name, arg_chunks } => {
                out.push(ant(json!({"type":"content_block_start","index":i,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}})));
                for c in arg_chunks {
                    out.push(ant(json!({"type":"content_block_delta","index":i,"delta":{"type":"input_json_delta","partial_json":c}})));
                }
            }
        }
        out.push(ant(json!({"type":"content_block_stop","index":i})));
    }
    let stop = match t.end {
        End::Stop => "end_turn",
        End::Length => "max_tokens",
        End::ToolUse => "tool_use",
    };
    out.push(ant(json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":output}})));
    out.push(ant(json!({"type":"message_stop"})));
    out
}

/// Splits a script after the first event that carries text (the stream has "output" then).
pub fn split_after_first_text(format: Format, events: &[String]) -> usize {
    let marker = match format {
        Format::OpenaiCompletions => "\"content\":\"",
        Format::OpenaiResponses => "response.output_text.delta",
        Format::Anthropic => "text_delta",
    };
    events.iter().position(|e| e.contains(marker) && !e.contains("\"content\":\"\"")).unwrap() + 1
}
