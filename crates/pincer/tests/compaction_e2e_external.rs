//! Compaction end to end, checked against the real Pi library (the part of `compaction_e2e.rs` that
//! needs the Pi oracle on Node, so it builds only with the `external` feature): a gateway with a
//! small context window chats with a fake provider until compaction triggers; the compaction entry
//! is on disk, the next model request carries the summary and only the kept messages, and Pi builds
//! the same context from the file; a tool loop over the window compacts and finishes.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::read_rows as entries;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "compaction_e2e/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_compaction_keeps_the_tail_and_pi_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start().await;
    let config = format!("{}{COMPACTION}", fake.gateway_toml_window(3000));
    let state = dir.path().join("state");
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &config)
    })
    .await
    .expect("start");
    let mut c = Client::connect(&gw.addr).await;
    let mut compacted_at = None;
    for n in 1..=8 {
        let run = format!("run-{n}");
        c.request("chat.send", json!({"sessionKey": "main", "message": message(n), "idempotencyKey": run}))
            .await
            .expect("send");
        let end = c.chat_end(&run).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
        let file = transcript(&state);
        if entries(&file).iter().any(|e| e["type"] == "compaction") {
            compacted_at = Some(n);
            break;
        }
    }
    let n = compacted_at.unwrap_or_else(|| {
        let reqs: Vec<String> =
            fake.requests().iter().map(|r| r.to_string()).filter(|r| r.contains("summarization")).collect();
        let short: Vec<String> = reqs.iter().take(3).map(|r| r.chars().take(700).collect()).collect();
        panic!("compaction never triggered: {}\n{}", gw.log_text(), short.join("\n----\n"))
    });
    let ev = c
        .event(|f| {
            f["event"] == "agent" && f["payload"]["stream"] == "compaction" && f["payload"]["data"]["phase"] == "end"
        })
        .await;
    assert_eq!(ev["payload"]["data"]["reason"], "threshold");
    let file = transcript(&state);
    let before = entries(&file);
    let at = before.iter().position(|e| e["type"] == "compaction").expect("compaction entry");
    let comp = &before[at];
    assert_eq!(comp["parentId"], before[at - 1]["id"], "chained to the leaf of the turn before it");
    assert_eq!(before[at - 1]["message"]["role"], "assistant", "written after a complete turn");
    assert!(comp["summary"].as_str().expect("summary").contains("## Goal"));
    assert!(comp["tokensBefore"].as_u64().expect("tokens") > 0);
    assert!(before[at + 1..].iter().all(|e| e["parentId"].is_string()), "later turns chain on");

    // The next model request carries the summary and only the kept messages.
    let run = "run-after";
    c.request("chat.send", json!({"sessionKey": "main", "message": "what next?", "idempotencyKey": run}))
        .await
        .expect("send");
    c.chat_end(run).await;
    // Stop the gateway (gracefully) so nothing else, such as another compaction, changes the file
    // while Pincer and Pi read it.
    let mut gw = gw;
    assert!(gw.terminate().success());
    let req = fake
        .requests()
        .iter()
        .rev()
        .find(|r| !r.to_string().contains("context summarization assistant"))
        .cloned()
        .expect("request");
    let msgs: Vec<&Value> =
        req["messages"].as_array().expect("messages").iter().filter(|m| m["role"] != "system").collect();
    let first = msgs[0]["content"].to_string();
    assert!(
        first.contains("The conversation history before this point was compacted into the following summary"),
        "{first}"
    );
    let all = req.to_string();
    assert!(
        !all.contains("turn-1: please look") || first.contains("turn-1"),
        "turn 1 survives only inside the summary"
    );
    let session = pincer_store::Session::parse(std::fs::read(&file).expect("read"));
    let ours = pincer_store::context_report(&session, &pincer_store::LeafArg::Default).expect("context").to_value();
    // The request is the context as it was before its own reply was appended.
    assert_eq!(
        msgs.len() + 1,
        ours["context"]["messages"].as_array().expect("messages").len(),
        "request = summary + kept + new"
    );
    let pi = pincer_testkit::oracle_context(&file, None);
    assert_eq!(pincer_testkit::comparable(&pi), pincer_testkit::comparable(&ours));
    assert_eq!(pi["context"]["messages"][0]["role"], "compactionSummary");

    // History shows the divider.
    let h =
        pincer_store::history::read_history(&file, pincer_store::history::HistoryOptions::default()).expect("history");
    assert!(h.messages.iter().any(|m| m["__openclaw"]["kind"] == "compaction"));
    let _ = n;
}

/// The highest `FILE-<k>` marker in a text (0 when none).
fn files_seen(text: &str) -> usize {
    text.match_indices("FILE-")
        .filter_map(|(at, _)| text[at + 5..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// A tool loop whose results outgrow the model's window: a scripted OpenAI-compatible model reads
/// four 6 KB files one call at a time and answers 400 `context_length_exceeded` whenever a request
/// is over 14 KB. Each overflow compacts (Pi's rule: one compact-and-retry, allowed again after a
/// reply has come through) and the same turn goes on from the summary until its final answer: no
/// reset, every row still on disk and chained, and the last request equal to the real Pi
/// library's context of the file. Then a message too big for the window fails naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loop_over_the_window_compacts_and_finishes() {
    use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Recorded, Reply};
    const LIMIT: usize = 14_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    for k in 1..=4 {
        let body = format!("FILE-{k}\n{}", format!("row {k} of the data set, padded to be long\n").repeat(150));
        std::fs::write(ws.join(format!("file{k}.txt")), body).expect("file");
    }
    let f = Format::OpenaiCompletions;
    let model = move |r: &Recorded, _n: usize| -> Option<Reply> {
        let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
        let all = r.body.to_string();
        if messages.first().is_some_and(|m| m["content"].to_string().contains("context summarization assistant")) {
            // The summarizer keeps the progress the model needs to go on.
            let summary = format!(
                "## Goal\nread the four files\n## Constraints & Preferences\n- none\n## Progress\n\
                 files read so far: up to FILE-{}\n## Key Decisions\n- none\n## Next Steps\n1. go on\n\
                 ## Critical Context\n- none\n## Original Request\nread the four files\n## Early Progress\n\
                 - reading\n## Context for Suffix\n- reading",
                files_seen(&all)
            );
            return Some(Reply::stream(script(f, &turn(vec![text(&[&summary])], (50, 20, 0)))));
        }
        if r.body_len > LIMIT {
            return Some(Reply::Status { status: 400, headers: vec![], body: f.context_length_body() });
        }
        let last = messages.last().map(|m| m["content"].to_string()).unwrap_or_default();
        let done = files_seen(&last);
        let reply = if done < 4 {
            let args = json!({"path": format!("file{}.txt", done + 1)}).to_string();
            turn(vec![tool_call(&format!("call-{}", done + 1), "read", &[&args])], (100, 10, 0))
        } else {
            turn(vec![text(&["Read all four files."])], (100, 10, 0))
        };
        Some(Reply::stream(script(f, &reply)))
    };
    let fake = FakeProvider::start_with(f, Default::default(), Box::new(model)).await;
    let config = format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"k\"\n\
         [[models.providers.fake.models]]\nid = \"m\"\ncontext_window = 100000\n\
         [agents.defaults]\nmodel = \"fake/m\"\nworkspace = \"{}\"\n\
         [agents.defaults.tools]\nprofile = \"minimal\"\n{COMPACTION}",
        fake.base_url(),
        ws.display()
    );
    let state = dir.path().join("state");
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &config)
    })
    .await
    .expect("start");
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "read the four files", "idempotencyKey": "loop"}))
        .await
        .expect("send");
    let end = c.chat_end("loop").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());
    assert_eq!(end["payload"]["message"]["content"][0]["text"], "Read all four files.");

    let file = transcript(&state);
    let rows = entries(&file);
    let shape: Vec<String> = rows
        .iter()
        .filter(|r| r["type"] == "message" || r["type"] == "compaction")
        .map(|r| match (r["type"].as_str(), r["message"]["role"].as_str()) {
            (Some("compaction"), _) => "compaction".to_owned(),
            (_, Some("assistant")) => format!("assistant:{}", r["message"]["stopReason"].as_str().unwrap_or("?")),
            (_, Some(role)) => role.to_owned(),
            _ => "?".to_owned(),
        })
        .collect();
    println!("rows: {shape:?}");
    let overflow = ["assistant:error", "compaction"];
    let read = ["assistant:toolUse", "toolResult"];
    let want: Vec<&str> =
        [&["user"][..], &read, &read, &overflow, &read, &read, &overflow, &["assistant:stop"]].concat();
    assert_eq!(shape, want, "two overflows, each compacted, and the turn went on");
    // Nothing was dropped: every row chains to the one before it.
    let chained: Vec<&Value> = rows.iter().skip_while(|r| r["type"] != "message").collect();
    for pair in chained.windows(2) {
        assert_eq!(pair[1]["parentId"], pair[0]["id"], "chained: {}", pair[1]);
    }
    let results = pincer_testkit::wire::tool_results(&file);
    let read_files: Vec<usize> = results.iter().map(|m| files_seen(pincer_testkit::wire::result_text(m))).collect();
    assert_eq!(read_files, [1, 2, 3, 4], "each file read once, in order");
    let compactions: Vec<&Value> = rows.iter().filter(|r| r["type"] == "compaction").collect();
    assert!(compactions[1]["summary"].as_str().expect("summary").contains("up to FILE-4"));

    // The last request is the real Pi library's context of the file before the final answer.
    let last_model_call = fake
        .bodies()
        .into_iter()
        .rev()
        .find(|b| !b.to_string().contains("context summarization assistant"))
        .expect("a model call");
    let final_row = rows.iter().rev().find(|r| r["message"]["role"] == "assistant").expect("final");
    let leaf = final_row["parentId"].as_str().expect("parent").to_owned();
    let pi = pincer_testkit::oracle_context(&file, Some(&leaf));
    let expected =
        pincer_testkit::wire::openai_messages(pi["context"]["messages"].as_array().map_or(&[][..], Vec::as_slice));
    let got: Vec<Value> = pincer_testkit::wire::conversation(&last_model_call);
    assert_eq!(got, expected, "the request after the second compaction against Pi's context");
    assert_eq!(pi["context"]["messages"][0]["role"], "compactionSummary");

    // The client's history still has every tool result (the compactions only shortened the context).
    let h = c.request("chat.history", json!({"sessionKey": "main", "limit": 1000})).await.expect("history");
    let shown = h["messages"].as_array().expect("messages").iter().filter(|m| m["role"] == "toolResult").count();
    assert_eq!(shown, 4, "{h}");

    // A message no compaction can make room for: the error names the cause.
    let huge = format!("please look at this: {}", "y".repeat(20_000));
    c.request("chat.send", json!({"sessionKey": "main", "message": huge, "idempotencyKey": "huge"}))
        .await
        .expect("send");
    let end = c.chat_end("huge").await;
    assert_eq!(end["payload"]["state"], "error", "{end}");
    assert_eq!(end["payload"]["errorKind"], "context_length", "{end}");
    let why = end["payload"]["errorMessage"].as_str().expect("message");
    assert!(why.contains("maximum context length") && why.contains("still too long after compacting"), "{why}");
}
