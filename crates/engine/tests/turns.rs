//! The turn rules in process: an engine over a temporary state directory and the shared fake
//! provider (a real HTTP server), no gateway, socket client or binary. Each test starts turns the
//! way every adapter does (`turn::start_turn`, released by its ack), follows the run's typed
//! `Progress` to its `TurnOutcome`, and reads the transcript file back.
#![allow(clippy::disallowed_methods, clippy::unwrap_used, clippy::expect_used)] // a fixture file; tests fail loudly

use pincer_engine::config::{self, Overrides};
use pincer_engine::error::EngineError;
use pincer_engine::follow::{TurnEvent, TurnStream};
use pincer_engine::sessions::SessionRef;
use pincer_engine::state::{Engine, TurnOutcome};
use pincer_engine::turn::{start_turn, TurnHandle, TurnRequest};
use pincer_testkit::fake_openai::FakeOpenAi;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Harness {
    gw: Arc<Engine>,
    /// What the engine was started with (for a second one on the same state directory).
    overrides: Overrides,
    fake: FakeOpenAi,
    /// The handle of each turn started (a finished run leaves the engine's registry).
    turns: Mutex<HashMap<String, Arc<TurnHandle>>>,
    /// The state directory, owned by the harness that made it.
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with("").await
    }

    /// [`Harness::start`] with more of the config file.
    async fn start_with(more: &str) -> Harness {
        let fake = FakeOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pincer.toml");
        std::fs::write(&path, format!("{}\n{more}", fake.gateway_toml())).unwrap();
        let overrides =
            Overrides { state_dir: Some(dir.path().to_owned()), config: Some(path), ..Overrides::default() };
        let settings = config::load(&overrides).unwrap();
        let gw = Arc::new(Engine::new(settings).unwrap());
        Harness { gw, overrides, fake, turns: Mutex::default(), _dir: Some(dir) }
    }

    /// Writes the user row of turn `run_id` in session `key` as a crash leaves it: no reply after it.
    async fn cut(&self, key: &str, run_id: &str) {
        let user = serde_json::json!({"role": "user", "content": "cut by a crash", "timestamp": 1,
            "idempotencyKey": format!("{run_id}:user")});
        let session = self.session(key).await;
        self.gw.append(&session, pincer_store::NewEntry::message(user)).await.unwrap();
    }

    /// Waits until `done` holds (10 s at most).
    async fn until(&self, done: impl AsyncFn() -> bool) {
        for _ in 0..1000 {
            if done().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// [`Harness::restarted`], once its startup has taken up the turns the last stop cut.
    async fn restarted_and_taken_up(&self) -> Harness {
        let again = self.restarted();
        pincer_engine::takeup::recover_interrupted(&again.gw);
        again.gw.recovered().await;
        again
    }

    /// Another engine on the same state directory, as after a restart (nothing kept in memory).
    fn restarted(&self) -> Harness {
        let gw = Arc::new(Engine::new(config::load(&self.overrides).unwrap()).unwrap());
        Harness { gw, overrides: self.overrides.clone(), fake: self.fake.clone(), turns: Mutex::default(), _dir: None }
    }

    async fn session(&self, key: &str) -> SessionRef {
        self.gw.session(key, true).await.unwrap().unwrap()
    }

    /// Starts a turn and lets it run (its ack given at once): the method's answer.
    async fn send(&self, key: &str, run_id: &str, text: &str) -> Value {
        self.send_to(key, run_id, text, None).await
    }

    /// [`Harness::send`] with the turn's own model, if given.
    async fn send_to(&self, key: &str, run_id: &str, text: &str, model: Option<&str>) -> Value {
        self.try_send_to(key, run_id, text, model).await.unwrap()
    }

    /// [`Harness::send_to`], its refusal kept.
    async fn try_send_to(
        &self,
        key: &str,
        run_id: &str,
        text: &str,
        model: Option<&str>,
    ) -> Result<Value, EngineError> {
        let session = self.session(key).await;
        let request = TurnRequest {
            session,
            run_id: run_id.into(),
            text: text.into(),
            images: vec![],
            regenerate: None,
            expected_leaf: None,
            graft: None,
            model: model.map(str::to_owned),
            conn_id: 0,
        };
        let (ack, acked) = tokio::sync::oneshot::channel();
        ack.send(()).unwrap();
        let turn = start_turn(&self.gw, request, acked).await?;
        let answer = turn.answer.to_value();
        if turn.run.is_some() {
            self.turns.lock().unwrap().entry(run_id.to_owned()).or_insert(Arc::new(turn));
        }
        Ok(answer)
    }

    /// The end of run `run_id`, from the handle its start gave.
    async fn outcome(&self, run_id: &str) -> TurnOutcome {
        let turn = self.turns.lock().unwrap().get(run_id).cloned().expect("the run was started");
        let end = tokio::time::timeout(Duration::from_secs(30), turn.outcome()).await;
        end.expect("the run ends").expect("a run started here has an outcome")
    }

    /// Waits until run `run_id` streams some text.
    async fn streaming(&self, run_id: &str) {
        let turn = self.turns.lock().unwrap().get(run_id).cloned().expect("the run was started");
        let mut rx = turn.run.as_ref().expect("a run").progress.subscribe();
        let seen = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|p| !p.text.is_empty())).await;
        seen.expect("the run streams").expect("the run's progress is kept");
    }

    /// The session's entries as written (the header left out), in file order.
    async fn entries(&self, key: &str) -> Vec<Value> {
        let path = self.session(key).await.path;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|e| e["type"] != "session").collect()
    }

    /// The session's message rows as written, in file order.
    async fn rows(&self, key: &str) -> Vec<Value> {
        self.entries(key).await.into_iter().filter(|e| e["type"] == "message").collect()
    }
}

fn role(e: &Value) -> &str {
    e["message"]["role"].as_str().unwrap_or_default()
}

/// A row's text (Pi's content: a string, or text blocks).
fn text(e: &Value) -> String {
    match &e["message"]["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_writes_its_user_row_then_one_reply_chained_to_it() {
    let e = Harness::start().await;
    let answer = e.send("main", "run-1", "hello engine").await;
    assert_eq!(answer["runId"], "run-1", "{answer}");
    let TurnOutcome::Replied(reply) = e.outcome("run-1").await else { panic!("not replied") };
    let rows = e.rows("main").await;
    assert_eq!(rows.iter().map(role).collect::<Vec<_>>(), ["user", "assistant"]);
    assert_eq!(text(&rows[0]), "hello engine");
    assert_eq!(rows[1]["parentId"], rows[0]["id"], "the reply is chained to its user row");
    assert_eq!(reply["content"], rows[1]["message"]["content"], "the outcome carries the row as written");
    assert_eq!(e.fake.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_run_id_again_is_answered_from_what_was_written_not_run_twice() {
    let e = Harness::start().await;
    e.send("main", "run-1", "once only").await;
    e.outcome("run-1").await;
    let again = e.send("main", "run-1", "once only").await;
    assert_ne!(again["status"], "started", "a repeated run id starts nothing: {again}");
    assert_eq!(e.rows("main").await.len(), 2, "no second user row, no second reply");
    assert_eq!(e.fake.requests().len(), 1, "the model was asked once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_sent_together_are_answered_in_order_each_after_the_last() {
    let e = Harness::start().await;
    for i in 1..=3 {
        e.send("main", &format!("q-{i}"), &format!("question {i}")).await;
    }
    for i in 1..=3 {
        assert!(matches!(e.outcome(&format!("q-{i}")).await, TurnOutcome::Replied(_)));
    }
    let rows = e.rows("main").await;
    assert_eq!(
        rows.iter().map(role).collect::<Vec<_>>(),
        ["user", "assistant", "user", "assistant", "user", "assistant"]
    );
    for (i, pair) in rows.chunks(2).enumerate() {
        assert_eq!(text(&pair[0]), format!("question {}", i + 1), "in the order sent");
        assert_eq!(role(&pair[1]), "assistant", "each question answered before the next is asked");
    }
    // The records of the turns that waited (`pincer.turn-queued`) are in the chain too.
    let all = e.entries("main").await;
    assert_eq!(all[0]["parentId"], Value::Null);
    for w in all.windows(2) {
        assert_eq!(w[1]["parentId"], w[0]["id"], "one chain, each entry after the last: {all:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_ends_a_streaming_run_with_one_partial_that_says_who_stopped_it() {
    let e = Harness::start().await;
    e.send("main", "slow-1", "[slow] take your time").await;
    e.streaming("slow-1").await;
    let stopped = pincer_engine::abort::abort(&e.gw, "agent:main:main", Some("slow-1"), "stop-command").await.unwrap();
    assert_eq!(stopped, ["slow-1"]);
    let TurnOutcome::Aborted(Some(written)) = e.outcome("slow-1").await else { panic!("not aborted with a partial") };
    let rows = e.rows("main").await;
    assert_eq!(rows.iter().map(role).collect::<Vec<_>>(), ["user", "assistant"], "one partial, no second reply");
    let partial = &rows[1]["message"];
    assert_eq!(partial["openclawAbort"]["aborted"], true, "{partial}");
    assert_eq!(partial["openclawAbort"]["origin"], "stop-command", "the partial names who stopped it");
    assert_eq!(partial["openclawAbort"]["runId"], "slow-1");
    assert_eq!(written["content"], partial["content"], "the outcome carries the partial as written");
    assert!(!text(&rows[1]).is_empty(), "the partial keeps what streamed");
}

/// Everything a followed turn says, to its end.
async fn follow_to_the_end(mut stream: TurnStream) -> Vec<TurnEvent> {
    let mut events = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("the turn ends") {
        events.push(e);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_turn_gives_its_text_then_its_reply_and_once_over_the_transcript_says_the_same() {
    let e = Harness::start().await;
    let session = e.session("main").await;
    e.send("main", "run-f", "hello follow").await;
    let turn = e.turns.lock().unwrap().get("run-f").cloned().expect("started");
    let live = follow_to_the_end(turn.follow(&e.gw, &session, "run-f")).await;
    let rows = e.rows("main").await;
    let reply = &rows[1];
    let (last, pieces) = live.split_last().expect("some events");
    let TurnEvent::Ended(written) = last else { panic!("the end comes last: {live:?}") };
    assert_eq!(written["content"], reply["message"]["content"], "the end carries the reply as written");
    let streamed: String = pieces
        .iter()
        .map(|p| match p {
            TurnEvent::Text(t) => t.as_str(),
            other => panic!("only text before the end: {other:?}"),
        })
        .collect();
    assert_eq!(streamed, text(reply), "the pieces make the reply's text");
    // Over (no handle: a retry after the run, a key answered before): read from the transcript.
    let over = follow_to_the_end(TurnStream::over(&e.gw, &session, "run-f")).await;
    assert_eq!(over, [TurnEvent::Text(text(reply)), TurnEvent::Ended(reply["message"].clone())]);
    let never = follow_to_the_end(TurnStream::over(&e.gw, &session, "no-such-run")).await;
    assert!(matches!(never.as_slice(), [TurnEvent::Unknown(why)] if why.contains("no-such-run")), "{never:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_for_a_model_no_provider_has_writes_nothing_and_says_which() {
    let e = Harness::start().await;
    e.send("main", "run-0", "a first turn").await;
    e.outcome("run-0").await;
    let before = e.entries("main").await;
    let refused = e.try_send_to("main", "run-1", "hello", Some("nowhere/no-model")).await;
    let Err(EngineError::Invalid(message)) = refused else { panic!("not refused: {refused:?}") };
    assert!(message.contains("nowhere"), "the error names the model: {message}");
    assert_eq!(e.entries("main").await, before, "nothing written, no queued record either");
    // A command needs no model: it runs.
    e.send_to("main", "run-2", "/status", Some("nowhere/no-model")).await;
    assert!(matches!(e.outcome("run-2").await, TurnOutcome::Replied(_)));
    assert_eq!(e.fake.requests().len(), 1, "the model was not asked");
}

/// A turn whose user row is on disk from before a restart, resumed for a model no provider has
/// any more: the failure is written as its reply (keyed), so the message is answered and the same
/// key asked again runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_that_fails_before_its_reply_is_answered_by_its_error_on_disk() {
    let e = Harness::start().await;
    e.cut("main", "run-1").await;
    let answer = e.send_to("main", "run-1", "cut by a crash", Some("nowhere/no-model")).await;
    assert_eq!(answer["status"], "started", "the turn is resumed: {answer}");
    let TurnOutcome::Failed { message, .. } = e.outcome("run-1").await else { panic!("not failed") };
    let rows = e.rows("main").await;
    assert_eq!(rows.iter().map(role).collect::<Vec<_>>(), ["user", "assistant"], "{rows:#?}");
    assert_eq!(rows[1]["message"]["idempotencyKey"], "run-1:assistant");
    assert_eq!(rows[1]["message"]["stopReason"], "error");
    assert_eq!(text(&rows[1]), message, "the row says what the client was told");
    let again = e.restarted().send("main", "run-1", "cut by a crash").await;
    assert_eq!(again["status"], "error", "answered from the transcript after a restart: {again}");
    assert_eq!(e.rows("main").await.len(), 2, "nothing more written");
    assert_eq!(e.fake.requests().len(), 0, "the model was never asked");
}

/// A turn resumed for its user row, which the session moved past while the turn waited for its
/// queue (another turn's user row chained after it): it does not run, and its message is marked
/// interrupted on disk, not left without an answer there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_the_session_moved_past_while_it_waited_is_marked_interrupted() {
    let e = Harness::start().await;
    e.cut("main", "run-1").await;
    let session = e.session("main").await;
    let slot = e.gw.turn_slot(&session.key, &e.gw.stopping()).await.unwrap();
    let answer = e.send("main", "run-1", "cut by a crash").await;
    assert_eq!(answer["status"], "started", "the turn is resumed: {answer}");
    e.cut("main", "run-2").await;
    drop(slot);
    let TurnOutcome::Failed { kind, .. } = e.outcome("run-1").await else { panic!("not failed") };
    assert_eq!(kind, "interrupted");
    let marked: Vec<Value> = (e.entries("main").await.into_iter())
        .filter(|x| x["customType"] == "pincer.turn-interrupted" && x["data"]["runId"] == "run-1")
        .collect();
    assert_eq!(marked.len(), 1, "one interrupted marker for run-1: {marked:#?}");
    assert_eq!(e.fake.requests().len(), 0, "the model was never asked");
}

/// A message acknowledged behind a running turn (its record written) that then fails before its
/// user row — here its hook cannot decide — is recorded as dropped: no restart runs it later,
/// after its client was told to send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_that_fails_before_it_runs_is_recorded_as_dropped() {
    let hook = "[hooks.before_agent_run]\ncommand = [\"sh\", \"-c\", \"if grep -q no-hook; then exit 3; fi; \
                echo '{\\\"outcome\\\":\\\"allow\\\"}'\"]\n";
    let e = Harness::start_with(hook).await;
    e.send("main", "slow-1", "[slow] take your time").await;
    e.streaming("slow-1").await;
    let answer = e.send("main", "q-1", "no-hook for this one").await;
    assert_eq!(answer["status"], "started", "{answer}");
    let queued = |entries: &[Value], kind: &str| {
        entries.iter().filter(|x| x["customType"] == kind && x["data"]["runId"] == "q-1").count()
    };
    assert_eq!(queued(&e.entries("main").await, "pincer.turn-queued"), 1, "recorded before its ack");
    pincer_engine::abort::abort(&e.gw, "agent:main:main", Some("slow-1"), "stop-command").await.unwrap();
    let TurnOutcome::Failed { kind, .. } = e.outcome("q-1").await else { panic!("not failed") };
    assert_eq!(kind, "hook");
    let entries = e.entries("main").await;
    assert_eq!(queued(&entries, "pincer.turn-dropped"), 1, "{entries:#?}");
    assert!(!entries.iter().any(|x| x["message"]["idempotencyKey"] == "q-1:user"), "no user row");
}

/// A message acknowledged while the startup take-up runs waits for it; it is on disk (its record)
/// before its ack, so a crash meanwhile does not lose it, and it runs once the take-up is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_acknowledged_during_the_startup_take_up_is_on_disk_before_its_ack() {
    let e = Harness::start().await;
    let recovering = e.gw.recovering.clone().write_owned().await;
    let answer = e.send("main", "run-1", "sent while the gateway takes up its turns").await;
    assert_eq!(answer["status"], "started", "{answer}");
    let entries = e.entries("main").await;
    let recorded: Vec<&Value> = entries.iter().filter(|x| x["customType"] == "pincer.turn-queued").collect();
    assert_eq!(recorded.len(), 1, "its record is written before the ack: {entries:#?}");
    assert_eq!(recorded[0]["data"]["runId"], "run-1");
    assert!(e.rows("main").await.is_empty(), "it has not run yet");
    drop(recovering);
    assert!(matches!(e.outcome("run-1").await, TurnOutcome::Replied(_)));
    assert_eq!(e.rows("main").await.iter().map(role).collect::<Vec<_>>(), ["user", "assistant"]);
}

/// A turn stopped before any reply was written (the model had not answered yet): marked on disk,
/// so a restart does not run again what its user stopped, nor does its key asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stopped_before_any_reply_is_not_run_again_after_a_restart() {
    let e = Harness::start().await;
    let pacing = pincer_testkit::fake_openai::Pacing { first: Duration::from_secs(5), ..Default::default() };
    e.fake.set_pacing(pacing);
    e.send("main", "run-1", "answer slowly").await;
    e.until(async || !e.fake.requests().is_empty()).await;
    assert_eq!(e.fake.requests().len(), 1, "the model was asked");
    let stopped = pincer_engine::abort::abort(&e.gw, "agent:main:main", Some("run-1"), "stop-command").await.unwrap();
    assert_eq!(stopped, ["run-1"]);
    assert!(matches!(e.outcome("run-1").await, TurnOutcome::Aborted(None)), "no partial");
    e.fake.set_pacing(Default::default());
    let again = e.restarted_and_taken_up().await;
    let answer = again.send("main", "run-1", "answer slowly").await;
    assert_eq!(answer["status"], "interrupted", "{answer}");
    assert_eq!(e.fake.requests().len(), 1, "the model was not asked again");
    assert_eq!(e.rows("main").await.iter().map(role).collect::<Vec<_>>(), ["user"], "no reply written");
}

/// A turn out of attempts when it claims its resume, still at the leaf, was just claimed by
/// another process (which answers it): it does not run and marks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_another_process_claimed_last_is_not_marked() {
    let e = Harness::start().await;
    e.cut("main", "run-1").await;
    let session = e.session("main").await;
    let slot = e.gw.turn_slot(&session.key, &e.gw.stopping()).await.unwrap();
    assert_eq!(e.send("main", "run-1", "cut by a crash").await["status"], "started");
    for _ in 0..e.gw.settings.resume_attempts {
        let claimed = pincer_engine::durable::marker(pincer_engine::durable::RESUMED, "run-1", "another process");
        e.gw.append(&session, claimed).await.unwrap();
    }
    drop(slot);
    let TurnOutcome::Failed { kind, .. } = e.outcome("run-1").await else { panic!("not failed") };
    assert_eq!(kind, "interrupted");
    let entries = e.entries("main").await;
    assert!(!entries.iter().any(|x| x["customType"] == "pincer.turn-interrupted"), "{entries:#?}");
    assert_eq!(e.fake.requests().len(), 0, "the model was never asked");
}

/// A turn the gateway's stop cut before any reply is not taken for one its user stopped: the next
/// start resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_by_the_gateways_stop_before_any_reply_is_resumed_after_the_restart() {
    let e = Harness::start().await;
    let pacing = pincer_testkit::fake_openai::Pacing { first: Duration::from_secs(5), ..Default::default() };
    e.fake.set_pacing(pacing);
    e.send("main", "run-1", "answer slowly").await;
    e.until(async || !e.fake.requests().is_empty()).await;
    // Cancelled the way a run registered after the stop's roll call is: by the stopping token only.
    e.gw.stop_runs();
    e.turns.lock().unwrap().get("run-1").unwrap().run.as_ref().unwrap().abort_origin.lock().unwrap().take();
    assert!(matches!(e.outcome("run-1").await, TurnOutcome::Aborted(None)), "no partial");
    let entries = e.entries("main").await;
    assert!(!entries.iter().any(|x| x["customType"] == "pincer.turn-interrupted"), "{entries:#?}");
    e.fake.set_pacing(Default::default());
    let again = e.restarted_and_taken_up().await;
    let answer = again.send("main", "run-1", "answer slowly").await;
    assert_eq!(answer["status"], "in_flight", "resumed at the start: {answer}");
}

/// A message queued before a restart, taken up after it for a model no provider has any more:
/// its turn fails and records the drop (no restart runs it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_taken_up_for_a_model_gone_is_recorded_as_dropped() {
    let e = Harness::start().await;
    let session = e.session("main").await;
    e.gw.append(&session, pincer_engine::durable::queued_marker("q-1", "waited", &[])).await.unwrap();
    let mut fields = serde_json::Map::new();
    fields.insert("model".into(), serde_json::json!("nowhere/no-model"));
    let key = session.key.clone();
    e.gw.index(move |s| s.patch(&key, &fields)).await.unwrap();
    let _restarted = e.restarted_and_taken_up().await; // kept while its take-up runs
    let dropped = |entries: &[Value]| {
        entries.iter().any(|x| x["customType"] == "pincer.turn-dropped" && x["data"]["runId"] == "q-1")
    };
    e.until(async || dropped(&e.entries("main").await)).await;
    assert!(dropped(&e.entries("main").await), "{:#?}", e.entries("main").await);
    assert!(e.rows("main").await.is_empty(), "no user row");
}
