//! One run per wire format persisted through the real transcript store (not the in-memory sink), then
//! read back by the real Pi library: a tool-call loop with thinking, a tool error and the final text
//! must give the same context in Pi as in Pincer, chained after the user turn.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod support;

use pincer_agent::{start_run, CancellationToken, RunRequest, ToolRegistry, TranscriptSink};
use pincer_store::{context_report, LeafArg, NewEntry, Session, Store, StoreOptions};
use pretty_assertions::assert_eq;
use serde_json::Value;

use std::path::PathBuf;

use std::sync::Arc;
use support::*;

struct FileSink {
    store: Store,
    path: PathBuf,
}

impl TranscriptSink for FileSink {
    fn append_message(&self, message: Value) -> pincer_agent::SinkFuture<'_> {
        let (store, path) = (self.store.clone(), self.path.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.append(&path, NewEntry::message(message)))
                .await
                .map_err(pincer_agent::SinkError::new)?
                .map(|a| a.entry)
                .map_err(pincer_agent::SinkError::new)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_provider_persists_through_the_store_and_pi_reads_it_back() {
    for f in ALL {
        let fake = FakeProvider::start(f).await;
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("notes.txt"), "buy milk").unwrap();
        let t1 = turn(
            vec![
                thinking(&["Let me ", "look."], "sig-1"),
                text(&["Checking."]),
                tool_call("call_1", "read", &["{\"path\": \"notes.txt\"}"]),
                tool_call("call_2", "read", &["{\"path\": \"../etc/passwd\"}"]),
            ],
            (50, 30, 0),
        );
        let t2 = turn(vec![text(&["You need ", "milk."])], (120, 4, 40));
        fake.push(Reply::stream(script(f, &t1)));
        fake.push(Reply::stream(script(f, &t2)));
        let file = ws.path().join("session.jsonl");
        let store = Store::new(StoreOptions::default());
        let first = store.append(&file, NewEntry::message(user("what do I need?"))).unwrap();
        let rx = start_run(RunRequest {
            model: fake.model(),
            system_prompt: Some("be brief".into()),
            messages: vec![pincer_agent::ContextMessage::shared(first.entry["message"].clone())].into(),
            tools: Arc::new(ToolRegistry::with_builtins(ws.path())),
            client_tools: Arc::new([]),
            sink: Arc::new(FileSink { store: store.clone(), path: file.clone() }),
            cancel: CancellationToken::new(),
            max_turns: 4,
            run_id: "r1".into(),
            max_reply_bytes: pincer_agent::DEFAULT_MAX_REPLY_BYTES,
        });
        let events = collect(rx).await;
        assert!(matches!(events.last(), Some(pincer_agent::RunEvent::Final { .. })), "{f:?}: {events:?}");

        let session = Session::parse(std::fs::read(&file).unwrap());
        let ours = context_report(&session, &LeafArg::Default).unwrap().to_value();
        let roles: Vec<&str> =
            ours["context"]["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, vec!["user", "assistant", "toolResult", "toolResult", "assistant"], "{f:?}");
        let msgs = ours["context"]["messages"].as_array().unwrap();
        assert_eq!(msgs[2]["isError"], false);
        assert_eq!(msgs[3]["isError"], true, "a path outside the workspace is refused");
        assert_eq!(msgs[4]["content"][0]["text"], "You need milk.");
        let pi = pincer_testkit::oracle_context(&file, None);
        assert_eq!(pincer_testkit::comparable(&pi), pincer_testkit::comparable(&ours), "{f:?}");
    }
}
