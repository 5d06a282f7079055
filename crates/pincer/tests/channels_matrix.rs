//! The Matrix channel against a real homeserver: a throwaway Synapse (testkit's [`Synapse`], one per
//! test binary), the real `pincer gateway` with the fake model provider, and Matrix users driven over
//! the client-server API. A user talks to the bot in a DM and in a room (replies arrive, edits
//! stream, the final content is the transcript's reply, the transcripts are chained and read by the
//! real Pi library); in a room the bot answers only what mentions it or replies to it (a room of
//! the bot and one user is a DM); a stranger gets no turn and their invite is declined; an encrypted room is
//! refused; messages sent while the gateway is down are answered once it is back; a storm of
//! SIGKILLs while users send and replies stream ends with exactly one turn and one delivered reply
//! per user message, counted on the homeserver; and with two PostgreSQL replicas one syncs at a time
//! and a survivor takes over from the stored position when it is killed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly
#![allow(clippy::disallowed_methods)] // the replica test writes its export and config files directly

use pincer_testkit::fake_openai::{FakeOpenAi, Pacing};
use pincer_testkit::gateway::{GatewayProcess, StartOptions};
use pincer_testkit::probe::{self, Rng};
use pincer_testkit::synapse::{MatrixUser, RoomMessage, Synapse};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const TOKEN_ENV: &str = "PINCER_TEST_MATRIX_TOKEN";
/// What a reply says when the run was cut short for good (the seam's text).
const PLACEHOLDER: &str = "…";

/// The `[channels.matrix]` section for `bot` on `syn`, allowing `allow`.
fn matrix_toml(syn: &Synapse, bot: &MatrixUser, allow: &[&str]) -> String {
    let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "\n[channels.matrix]\nhomeserver_url = \"{}\"\nuser_id = \"{}\"\naccess_token_env = \"{TOKEN_ENV}\"\nallow_from = [{}]\n\
         sync_timeout_secs = 5\n",
        syn.url(),
        bot.user_id,
        allow.join(", ")
    )
}

/// A gateway with the Matrix channel; returned once its first sync is done.
fn start_gateway(dir: &Path, config: &str, bot: &MatrixUser) -> GatewayProcess {
    let options = StartOptions { env: vec![(TOKEN_ENV.into(), bot.token.clone())], ..Default::default() };
    let gw = GatewayProcess::start_with(BIN, dir, config, &options);
    wait_log(&gw, "matrix: syncing");
    gw
}

fn wait_log(gw: &GatewayProcess, needle: &str) {
    probe::poll(Duration::from_secs(60), Duration::from_millis(50), || gw.log_text().contains(needle).then_some(()))
        .unwrap_or_else(|| panic!("the gateway never logged {needle:?}:\n{}", gw.log_text()));
}

/// Polls `f` every 200 ms for up to `secs` seconds.
async fn until<T, F: std::future::Future<Output = Option<T>>>(secs: u64, what: &str, f: impl FnMut() -> F) -> T {
    probe::poll_async(Duration::from_secs(secs), Duration::from_millis(200), f)
        .await
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Waits until `user` sees `bot` joined in `room`.
async fn until_joined(user: &MatrixUser, room: &str, bot: &str) {
    until(60, "the bot to join", || async move {
        (user.membership(room, bot).await.as_deref() == Some("join")).then_some(())
    })
    .await;
}

/// The bot's messages in `room` (edits folded in).
async fn bot_messages(user: &MatrixUser, room: &str, bot: &str) -> Vec<RoomMessage> {
    user.messages(room).await.into_iter().filter(|m| m.sender == bot).collect()
}

/// The bot's reply to `event` once its final text is there (not the placeholder, and `done` says so).
async fn reply_to(user: &MatrixUser, room: &str, bot: &str, event: &str, done: impl Fn(&str) -> bool) -> RoomMessage {
    let done = &done;
    until(120, &format!("the bot's reply to {event}"), || async move {
        bot_messages(user, room, bot)
            .await
            .into_iter()
            .find(|m| replied(m) == Some(event) && m.final_body != PLACEHOLDER && done(&m.final_body))
    })
    .await
}

/// The user event a bot message answers (`m.in_reply_to`).
fn replied(m: &RoomMessage) -> Option<&str> {
    m.content["m.relates_to"]["m.in_reply_to"]["event_id"].as_str()
}

/// The session key of a channel conversation as the gateway folds it (lowercase).
fn key(kind: &str, id: &str) -> String {
    format!("agent:main:matrix:{kind}:{id}").to_lowercase()
}

/// The text of the reply that ends the turn of user event `event`: the last assistant row between
/// its user row (keyed `<run>:user`, the run id ending with the event id) and the next user row.
fn transcript_reply(rows: &[Value], event: &str) -> Option<String> {
    let suffix = format!("-{event}:user");
    let is_user = |r: &Value| r["type"] == "message" && r["message"]["role"] == "user";
    let at = rows
        .iter()
        .position(|r| is_user(r) && r["message"]["idempotencyKey"].as_str().is_some_and(|k| k.ends_with(&suffix)))?;
    let turn = rows[at + 1..].iter().take_while(|r| !is_user(r));
    let reply = turn.filter(|r| r["type"] == "message" && r["message"]["role"] == "assistant").last()?;
    Some(probe::message_text(&reply["message"]))
}

/// The user rows of a transcript keyed with a Matrix event id, as `event → count`.
fn user_turns(rows: &[Value]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in rows {
        let Some(k) = r["message"]["idempotencyKey"].as_str() else { continue };
        if r["message"]["role"] != "user" || !k.starts_with("matrix-") {
            continue;
        }
        // Event ids are `$` and URL-safe base64 (which has `-`): from the last `$`.
        let event = k.trim_end_matches(":user");
        let event = event[event.rfind('$').unwrap_or(0)..].to_owned();
        *out.entry(event).or_insert(0) += 1;
    }
    out
}

/// Waits until the transcript of `file` holds the final delivery receipts of `turns` turns (the
/// deliverer writes them after the homeserver took the final edit, so the file is still growing when
/// the reply shows), and returns its rows.
fn settled(file: &Path, turns: usize) -> Vec<Value> {
    probe::poll(Duration::from_secs(60), Duration::from_millis(100), || {
        // (A line being appended right now is read again on the next look.)
        let (rows, torn) = probe::read_rows_lossy(file);
        let delivered: HashSet<&str> = rows
            .iter()
            .filter(|r| r["customType"] == "pincer.channel-delivery")
            .filter(|r| r["data"]["phase"] == "receipt" && r["data"]["part"] == "final")
            .filter_map(|r| r["data"]["runId"].as_str())
            .collect();
        (torn == 0 && delivered.len() == turns).then_some(rows.clone())
    })
    .unwrap_or_else(|| panic!("{} never held {turns} final delivery receipts", file.display()))
}

/// Whether a sync from position `since` (as `bot`) no longer brings `event`: the position is past it.
async fn past(bot: &MatrixUser, since: &str, event: &str) -> bool {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    let filter = serde_json::json!({"room": {"timeline": {"limit": 100}}}).to_string();
    let path = format!("/sync?timeout=0&since={}&filter={}", enc(since), enc(&filter));
    let Ok(v) = bot.call(reqwest::Method::GET, &path, None).await else { return false };
    !v["rooms"]["join"]
        .as_object()
        .into_iter()
        .flat_map(|rooms| rooms.values())
        .any(|r| r["timeline"]["events"].as_array().is_some_and(|events| events.iter().any(|e| e["event_id"] == event)))
}

/// The transcript is whole (`pincer transcript verify`) and the real Pi library builds the same context as Pincer.
fn check_chain(file: &Path) {
    let (code, out) = probe::verify(BIN, file);
    assert_eq!(code, Some(0), "verify {}: {out}", file.display());
    let pi = pincer_testkit::oracle_context(file, None);
    let ours = pincer_store::context_report(
        &pincer_store::Session::parse(std::fs::read(file).expect("read")),
        &pincer_store::LeafArg::Default,
    )
    .expect("context")
    .to_value();
    assert_eq!(pincer_testkit::comparable(&pi), pincer_testkit::comparable(&ours), "{}", file.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_talks_to_the_bot_in_a_dm_and_in_a_room() {
    let syn = Synapse::shared();
    eprintln!("synapse answered {:?} after its start", syn.started_in);
    let (bot, alice, carol) = (syn.register("bot").await, syn.register("alice").await, syn.register("carol").await);
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}", fake.gateway_toml(), matrix_toml(syn, &bot, &[&alice.user_id, &carol.user_id]));
    let gw = start_gateway(dir.path(), &config, &bot);

    // A direct chat: the invite is accepted, the reply streams as edits of one message.
    let dm = alice.create_room(&[&bot.user_id], true, false).await;
    until_joined(&alice, &dm, &bot.user_id).await;
    let first = alice.send_text(&dm, "[slow] tell me a story").await;
    let story: String = (0..40).map(|i| format!("word{i} ")).collect::<String>().trim_end().to_owned();
    let m = reply_to(&alice, &dm, &bot.user_id, &first, |b| b == story).await;
    assert!(m.edits >= 3, "the reply streamed as edits: {} edits", m.edits);
    assert_eq!(m.body, PLACEHOLDER, "the message edits streamed into");
    let html = m.final_formatted.clone().expect("formatted_body");
    assert!(html.contains("word39"), "{html}");
    // Markdown becomes HTML; raw HTML in the text is escaped.
    let second = alice.send_text(&dm, "make it **bold** <b>raw</b>").await;
    let m2 = reply_to(&alice, &dm, &bot.user_id, &second, |b| b.contains("bold")).await;
    assert_eq!(m2.final_body, "Fake reply: you said \"make it **bold** <b>raw</b>\"");
    let html = m2.final_formatted.clone().expect("formatted_body");
    assert!(html.contains("<strong>bold</strong>") && html.contains("&lt;b&gt;raw&lt;/b&gt;"), "{html}");
    assert_eq!(m2.content["format"], "org.matrix.custom.html");

    // The transcript holds both turns, chained; each reply on the homeserver is the transcript's.
    let dm_key = key("dm", &alice.user_id);
    let file = probe::transcript_path(dir.path(), &dm_key).expect("the DM's session");
    let rows = settled(&file, 2);
    // (Replies go out without trailing white space.)
    let said = |event: &str| transcript_reply(&rows, event).map(|t| t.trim_end().to_owned());
    assert_eq!(said(&first), Some(m.final_body.clone()));
    assert_eq!(said(&second), Some(m2.final_body.clone()));
    assert_eq!(user_turns(&rows).len(), 2);
    check_chain(&file);
    let index = probe::session_index(dir.path(), "main");
    assert_eq!(index[&dm_key]["chatType"], "direct", "{}", index[&dm_key]);

    // A room: two people talk, each gets a reply, one session for the room.
    let room = alice.create_room(&[&bot.user_id, &carol.user_id], false, false).await;
    until_joined(&alice, &room, &bot.user_id).await;
    carol.join(&room).await;
    // (Addressed to the bot: in rooms it answers only that.)
    let a = alice.send_mention(&room, &bot.user_id, &bot.user_id, "hello room").await;
    let c = carol.send_mention(&room, &bot.user_id, &bot.user_id, "me too").await;
    reply_to(&alice, &room, &bot.user_id, &a, |b| b == "Fake reply: you said \"hello room\"").await;
    reply_to(&carol, &room, &bot.user_id, &c, |b| b == "Fake reply: you said \"me too\"").await;
    let room_key = key("group", &room);
    let file = probe::transcript_path(dir.path(), &room_key).expect("the room's session");
    let rows = settled(&file, 2);
    assert_eq!(user_turns(&rows).len(), 2, "both people's messages in the room's session");
    check_chain(&file);
    assert_eq!(bot_messages(&alice, &room, &bot.user_id).await.len(), 2, "one message per reply");
    assert!(!gw.log_text().contains(&bot.token), "the access token is never logged");
    assert!(!std::fs::read_to_string(&file).unwrap().contains(&bot.token));
}

/// In a room of three, the bot answers only messages addressed to it: a mention (its pill, by
/// display name, or `m.mentions` alone) or a reply to one of its messages. Other messages get no
/// turn and no reply, and the sync position moves past them; a room of the bot and one user is
/// answered whatever is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_room_the_bot_answers_only_when_mentioned_or_replied_to() {
    let syn = Synapse::shared();
    let (bot, alice, carol) = (syn.register("bot").await, syn.register("alice").await, syn.register("carol").await);
    bot.set_display_name("Pincer Helper").await;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}", fake.gateway_toml(), matrix_toml(syn, &bot, &[&alice.user_id, &carol.user_id]));
    let options = StartOptions {
        env: vec![
            (TOKEN_ENV.into(), bot.token.clone()),
            ("PINCER_LOG".into(), "info,pincer_gateway::channels::matrix=debug".into()),
        ],
        ..Default::default()
    };
    let gw = GatewayProcess::start_with(BIN, dir.path(), &config, &options);
    wait_log(&gw, "matrix: syncing");
    let room = alice.create_room(&[&bot.user_id, &carol.user_id], false, false).await;
    until_joined(&alice, &room, &bot.user_id).await;
    carol.join(&room).await;
    let said = |text: &str| format!("Fake reply: you said \"{text}\"");

    // Chatter among people: no turn, no reply; logged at debug; the sync position moves past it.
    let cursor = || {
        let entries = std::fs::read_dir(dir.path().join("channels")).ok()?;
        let file = entries.flatten().find(|e| e.file_name().to_string_lossy().starts_with("matrix-"))?;
        let v: Value = serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()?;
        v["cursor"].as_str().map(str::to_owned)
    };
    let chatter = alice.send_text(&room, "just chatting among ourselves").await;
    until(60, "the sync position past the chatter", || {
        let (bot, chatter, cursor) = (&bot, &chatter, cursor());
        async move { (past(bot, cursor?.as_str(), chatter).await).then_some(()) }
    })
    .await;
    assert!(probe::transcript_path(dir.path(), &key("group", &room)).is_none(), "the chatter made a turn");
    let line = gw.log_text().lines().find(|l| l.contains(&chatter)).unwrap_or_default().to_owned();
    assert!(line.contains("not addressed to the bot"), "the chatter is logged at debug: {line:?}");

    // Element's mention (the pill, by display name, and m.mentions): answered, without the name.
    let pill = alice.send_mention(&room, &bot.user_id, "Pincer Helper", "what is up").await;
    let first = reply_to(&alice, &room, &bot.user_id, &pill, |b| b == said("what is up")).await;
    // The display name alone, in the text.
    let named = carol.send_text(&room, "pincer helper, how are you").await;
    reply_to(&carol, &room, &bot.user_id, &named, |b| b == said("how are you")).await;
    // A reply to the bot's message, with no mention.
    let reply = carol
        .send_content(
            &room,
            serde_json::json!({"msgtype": "m.text", "body": "tell me more",
                "m.relates_to": {"m.in_reply_to": {"event_id": first.event_id}}}),
        )
        .await;
    reply_to(&carol, &room, &bot.user_id, &reply, |b| b == said("tell me more")).await;
    // A reply to someone else's message is people talking: no turn.
    let aside = alice
        .send_content(
            &room,
            serde_json::json!({"msgtype": "m.text", "body": "agreed",
                "m.relates_to": {"m.in_reply_to": {"event_id": named}}}),
        )
        .await;
    wait_log(&gw, &format!("event={aside}"));
    // Something after it that is for the bot is answered: nothing was held up.
    let last = alice.send_mention(&room, &bot.user_id, &bot.user_id, "last one").await;
    reply_to(&alice, &room, &bot.user_id, &last, |b| b == said("last one")).await;

    let file = probe::transcript_path(dir.path(), &key("group", &room)).expect("the room's session");
    let rows = settled(&file, 4);
    let turns = user_turns(&rows);
    for e in [&pill, &named, &reply, &last] {
        assert_eq!(turns.get(e.as_str()), Some(&1), "a turn for {e}: {turns:?}");
    }
    assert_eq!(turns.len(), 4, "no turn for the chatter or the aside: {turns:?}");
    let users: Vec<String> =
        rows.iter().filter(|r| r["message"]["role"] == "user").map(|r| probe::message_text(&r["message"])).collect();
    assert_eq!(users, ["what is up", "how are you", "tell me more", "last one"], "the mention is not part of the text");
    let replies = bot_messages(&alice, &room, &bot.user_id).await;
    assert_eq!(replies.len(), 4, "one reply per addressed message: {replies:?}");
    assert!(replies.iter().all(|m| replied(m) != Some(chatter.as_str()) && replied(m) != Some(aside.as_str())));
    assert!(fake.requests().iter().all(|r| !r.to_string().contains("just chatting")), "the model never saw it");
    check_chain(&file);

    // A room of the bot and one person (not marked direct) is a conversation with the bot.
    let pair = alice.create_room(&[&bot.user_id], false, false).await;
    until_joined(&alice, &pair, &bot.user_id).await;
    let plain = alice.send_text(&pair, "no need to mention you here").await;
    reply_to(&alice, &pair, &bot.user_id, &plain, |b| b == said("no need to mention you here")).await;
}

/// Messages sent while the gateway is down are answered once it is back (the saved sync position),
/// and what it had answered before is not answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_while_the_gateway_is_down_are_answered_once_it_is_back() {
    let syn = Synapse::shared();
    let (bot, alice) = (syn.register("bot").await, syn.register("alice").await);
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}", fake.gateway_toml(), matrix_toml(syn, &bot, &[&alice.user_id]));
    let mut gw = start_gateway(dir.path(), &config, &bot);
    let dm = alice.create_room(&[&bot.user_id], true, false).await;
    until_joined(&alice, &dm, &bot.user_id).await;
    let before = alice.send_text(&dm, "before the stop").await;
    reply_to(&alice, &dm, &bot.user_id, &before, |b| b.contains("before the stop")).await;
    // The sync position is on disk (the homeserver's 2-minute cache of sync answers would hide a
    // missing one from the restart below: a first sync repeated soon gets the old answer).
    let cursor = probe::poll(Duration::from_secs(30), Duration::from_millis(100), || {
        let entries = std::fs::read_dir(dir.path().join("channels")).ok()?;
        let file = entries.flatten().find(|e| e.file_name().to_string_lossy().starts_with("matrix-"))?;
        let v: Value = serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()?;
        v["cursor"].as_str().map(str::to_owned)
    });
    assert!(cursor.is_some(), "no saved sync position in {}", dir.path().join("channels").display());
    gw.kill9();
    let mut sent = Vec::new();
    for i in 0..3 {
        sent.push(alice.send_text(&dm, &format!("while down {i}")).await);
    }
    gw.restart();
    for (i, event) in sent.iter().enumerate() {
        let want = format!("Fake reply: you said \"while down {i}\"");
        reply_to(&alice, &dm, &bot.user_id, event, |b| b == want).await;
    }
    assert_eq!(bot_messages(&alice, &dm, &bot.user_id).await.len(), 4, "one reply each, none twice");
    let rows = probe::transcript_rows(dir.path(), &key("dm", &alice.user_id));
    assert_eq!(user_turns(&rows).len(), 4);
    assert!(user_turns(&rows).values().all(|&n| n == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_no_turn_and_their_invite_is_declined() {
    let syn = Synapse::shared();
    let (bot, alice, mallory) = (syn.register("bot").await, syn.register("alice").await, syn.register("mallory").await);
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}", fake.gateway_toml(), matrix_toml(syn, &bot, &[&alice.user_id]));
    let gw = start_gateway(dir.path(), &config, &bot);

    // Mallory's invite is declined: the bot never joins.
    let theirs = mallory.create_room(&[&bot.user_id], true, false).await;
    until(60, "the invite to be declined", || {
        let (m, r, b) = (&mallory, &theirs, &bot.user_id);
        async move { (m.membership(r, b).await.as_deref() == Some("leave")).then_some(()) }
    })
    .await;
    wait_log(&gw, "an invite from a user not on allow_from was declined");
    assert!(gw.log_text().contains(&mallory.user_id), "the log names the inviter");

    // In a room Alice invited the bot to, Mallory's message is no turn (logged); Alice's after it is.
    let room = alice.create_room(&[&bot.user_id, &mallory.user_id], false, false).await;
    until_joined(&alice, &room, &bot.user_id).await;
    mallory.join(&room).await;
    mallory.send_text(&room, "let me in").await;
    let a = alice.send_mention(&room, &bot.user_id, &bot.user_id, "hello from alice").await;
    reply_to(&alice, &room, &bot.user_id, &a, |b| b.contains("hello from alice")).await;
    wait_log(&gw, "a message from a sender not on allow_from was ignored");
    let rows = probe::transcript_rows(dir.path(), &key("group", &room));
    assert_eq!(user_turns(&rows).len(), 1, "only Alice's message is a turn");
    assert!(
        !rows.iter().any(|r| probe::message_text(&r["message"]).contains("let me in")),
        "no trace of Mallory's text"
    );
    assert_eq!(bot_messages(&alice, &room, &bot.user_id).await.len(), 1, "one reply, to Alice");
    assert!(fake.requests().iter().all(|r| !r.to_string().contains("let me in")), "the model never saw it");

    // `pincer channels status`'s source counts them: the invite and the message refused, Alice's taken.
    pincer_agent::install_crypto_provider();
    let status: Value = reqwest::Client::new()
        .get(format!("http://{}/api/channels", gw.addr))
        .bearer_auth(pincer_testkit::gateway::TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = status["channels"].as_array().unwrap().iter().find(|c| c["id"] == "matrix").cloned().unwrap();
    assert_eq!(
        (row["state"].as_str(), row["account"].as_str()),
        (Some("running"), Some(bot.user_id.as_str())),
        "{row}"
    );
    assert!(row["refused"].as_u64() >= Some(2) && row["received"].as_u64() >= Some(1), "{row}");
    assert!(row["sent"].as_u64() >= Some(1), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_room_is_refused_in_the_room_and_the_log() {
    let syn = Synapse::shared();
    let (bot, alice) = (syn.register("bot").await, syn.register("alice").await);
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}", fake.gateway_toml(), matrix_toml(syn, &bot, &[&alice.user_id]));
    let gw = start_gateway(dir.path(), &config, &bot);

    let room = alice.create_room(&[&bot.user_id], true, true).await;
    assert!(alice.has_state(&room, "m.room.encryption").await);
    let notice = until(60, "the refusal notice", || {
        let (a, r, b) = (&alice, &room, &bot.user_id);
        async move { bot_messages(a, r, b).await.into_iter().find(|m| m.content["msgtype"] == "m.notice") }
    })
    .await;
    assert!(notice.body.contains("end-to-end encrypted"), "{}", notice.body);
    wait_log(&gw, "an end-to-end encrypted room was refused");
    until(60, "the bot to leave", || {
        let (a, r, b) = (&alice, &room, &bot.user_id);
        async move { (a.membership(r, b).await.as_deref() == Some("leave")).then_some(()) }
    })
    .await;
    assert!(probe::transcript_path(dir.path(), &key("dm", &alice.user_id)).is_none(), "no session for it");
}

/// Users keep sending while the gateway is SIGKILLed and restarted again and again (mid-sync,
/// mid-turn, mid-stream, between a send and its receipt): every message ends with exactly one turn
/// and exactly one reply message on the homeserver whose final text is the model's whole reply,
/// and every transcript is chained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_kills_while_users_send_loses_and_duplicates_nothing() {
    const KILLS: usize = 12;
    const PER_CONVERSATION: usize = 8;
    let syn = Synapse::shared();
    let bot = syn.register("bot").await;
    let mut users = Vec::new();
    for i in 0..3 {
        users.push(syn.register(&format!("storm{i}")).await);
    }
    // Replies stream a word every 150 ms (a second or two each), so kills land mid-stream.
    let pacing = Pacing { first: Duration::from_millis(100), word: Duration::from_millis(150), ..Pacing::default() };
    let fake = FakeOpenAi::start_paced(pacing).await;
    let dir = tempfile::tempdir().unwrap();
    let allow: Vec<&str> = users.iter().map(|u| u.user_id.as_str()).collect();
    // A turn cut by a kill is resumed by the next process, however often that happens here.
    let config = format!("{}resume_attempts = 100\n{}", fake.gateway_toml(), matrix_toml(syn, &bot, &allow));
    let mut gw = start_gateway(dir.path(), &config, &bot);

    // Each user's DM, and a room shared by two of them.
    let mut conversations: Vec<(MatrixUser, String)> = Vec::new();
    for u in &users {
        let dm = u.create_room(&[&bot.user_id], true, false).await;
        until_joined(u, &dm, &bot.user_id).await;
        conversations.push((u.clone(), dm));
    }
    let room = users[0].create_room(&[&bot.user_id, &users[1].user_id], false, false).await;
    until_joined(&users[0], &room, &bot.user_id).await;
    users[1].join(&room).await;
    conversations.push((users[0].clone(), room.clone()));
    conversations.push((users[1].clone(), room.clone()));

    // Senders: each conversation sends its messages 1–4 s apart, whatever the gateway is doing (in
    // the room, mentioning the bot).
    let mut senders = Vec::new();
    for (c, (user, room)) in conversations.iter().enumerate() {
        let (user, room, bot_id, in_room) = (user.clone(), room.clone(), bot.user_id.clone(), c >= users.len());
        senders.push(tokio::spawn(async move {
            let mut rng = Rng(0x5eed_0000 + c as u64);
            let mut sent = Vec::new();
            for i in 0..PER_CONVERSATION {
                tokio::time::sleep(Duration::from_millis(rng.range(1000, 4000))).await;
                let text = format!("storm c{c} m{i} please answer this one word by word");
                let event = if in_room {
                    user.send_mention(&room, &bot_id, &bot_id, &text).await
                } else {
                    user.send_text(&room, &text).await
                };
                sent.push((room.clone(), event, text));
            }
            sent
        }));
    }
    // The killer: SIGKILL, 1–2.5 s apart, while the senders send and replies stream; every other
    // time the gateway stays down a while, so that messages pile up on the homeserver meanwhile.
    let killer = tokio::task::spawn_blocking(move || {
        let mut rng = Rng(0xdead_beef);
        for k in 0..KILLS {
            std::thread::sleep(Duration::from_millis(rng.range(1000, 2500)));
            gw.kill9();
            if k % 2 == 0 {
                std::thread::sleep(Duration::from_millis(rng.range(500, 2000)));
            }
            gw.restart();
        }
        gw
    });
    let mut sent: Vec<(String, String, String)> = Vec::new();
    for s in senders {
        sent.extend(s.await.unwrap());
    }
    let gw = killer.await.unwrap();
    assert_eq!(sent.len(), conversations.len() * PER_CONVERSATION);
    // The storm is over: no kill can land mid-stream any more, so the replies still owed (often
    // dozens, one at a time per room) stream at once instead of a word every 150 ms.
    fake.set_pacing(Pacing::default());

    // Every message gets its reply (generous: the last process catches up on what the others left).
    let started = Instant::now();
    let rooms: HashSet<String> = sent.iter().map(|(r, _, _)| r.clone()).collect();
    let reader = |room: &str| conversations.iter().find(|(_, r)| r == room).map(|(u, _)| u.clone()).unwrap();
    let finals = until(600, "every message's final reply", || {
        let (sent, rooms, reader, bot) = (&sent, &rooms, &reader, &bot.user_id);
        async move {
            let mut all = Vec::new();
            for room in rooms {
                all.extend(bot_messages(&reader(room), room, bot).await);
            }
            let done = sent.iter().all(|(_, event, text)| {
                let want = format!("Fake reply: you said \"{text}\"");
                all.iter().any(|m| replied(m) == Some(event.as_str()) && m.final_body == want)
            });
            done.then_some(all)
        }
    })
    .await;
    eprintln!("all replies final {:?} after the last kill", started.elapsed());

    // Exactly one reply message per user message: no duplicate, none without the message it answers.
    let mut per_event: HashMap<&str, usize> = HashMap::new();
    for m in &finals {
        let to = replied(m).unwrap_or_else(|| panic!("a bot message that answers nothing: {:?}", m.content));
        *per_event.entry(to).or_insert(0) += 1;
    }
    for (_, event, text) in &sent {
        assert_eq!(per_event.get(event.as_str()), Some(&1), "replies to {text:?} ({event})");
    }
    assert_eq!(finals.len(), sent.len(), "one bot message per user message");

    // Exactly one turn per message, each reply the transcript's, every transcript chained.
    let mut keys: Vec<String> = users.iter().map(|u| key("dm", &u.user_id)).collect();
    keys.push(key("group", &room));
    let mut turns: HashMap<String, usize> = HashMap::new();
    for k in &keys {
        let file = probe::transcript_path(dir.path(), k).unwrap_or_else(|| panic!("no session {k}"));
        let turns_here = user_turns(&probe::read_rows(&file)).len();
        let rows = settled(&file, turns_here);
        for (event, n) in user_turns(&rows) {
            *turns.entry(event).or_insert(0) += n;
        }
        for (_, event, text) in &sent {
            if let Some(said) = transcript_reply(&rows, event) {
                assert_eq!(said.trim_end(), format!("Fake reply: you said \"{text}\""));
            }
        }
        check_chain(&file);
    }
    for (_, event, text) in &sent {
        assert_eq!(turns.get(event.as_str()), Some(&1), "turns of {text:?}");
    }
    assert_eq!(turns.len(), sent.len(), "no turn for anything else");
    assert!(!gw.log_text().contains(&bot.token));
}

/// Whether `body` is the fake's whole answer to `text` (a `[slow]` one: its 40 words).
fn answers(text: &str, body: &str) -> bool {
    if text.contains("[slow]") {
        return body.trim_end() == (0..40).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ");
    }
    body == format!("Fake reply: you said \"{text}\"")
}

/// Two replicas on PostgreSQL: one syncs the bot at a time (the channel lease) while the other
/// stands by; SIGKILLed in the middle of a reply, with two more messages waiting behind it, it is
/// replaced by the survivor, which takes over the cut turn and the waiting ones (the runs of a dead
/// replica) and goes on from the sync position in the database: every message, before and after,
/// is answered exactly once, its turn written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_one_syncs_and_a_survivor_takes_over_when_it_is_killed() {
    let syn = Synapse::shared();
    let (bot, alice) = (syn.register("bot").await, syn.register("alice").await);
    let pg = pincer_testkit::postgres::Postgres::shared();
    let url = pg.database("matrix");
    let pacing = Pacing { word: Duration::from_millis(100), ..Pacing::default() };
    let fake = FakeOpenAi::start_paced(pacing).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\npool_size = 4\n",
        fake.gateway_toml(),
        matrix_toml(syn, &bot, &[&alice.user_id])
    );
    let env = |i: usize| {
        let env = vec![("PINCER_REPLICA_ID".into(), format!("replica-{i}")), (TOKEN_ENV.into(), bot.token.clone())];
        StartOptions { env, ..Default::default() }
    };
    let mut replicas: Vec<GatewayProcess> =
        (0..2).map(|i| GatewayProcess::start_with(BIN, &dir.path().join(format!("r{i}")), &config, &env(i))).collect();
    // One takes the lease and syncs; the other stands by.
    let active = probe::poll(Duration::from_secs(60), Duration::from_millis(50), || {
        let syncing: Vec<usize> = (0..2).filter(|&i| replicas[i].log_text().contains("matrix: syncing")).collect();
        let waiting = (0..2).any(|i| replicas[i].log_text().contains("another replica polls this channel account"));
        (syncing.len() == 1 && waiting).then(|| syncing[0])
    })
    .expect("one replica syncs, the other stands by");

    let dm = alice.create_room(&[&bot.user_id], true, false).await;
    until_joined(&alice, &dm, &bot.user_id).await;
    let mut sent = Vec::new();
    let text = "before the kill 0".to_owned();
    sent.push((alice.send_text(&dm, &text).await, text));
    let want = format!("Fake reply: you said \"{}\"", sent[0].1);
    reply_to(&alice, &dm, &bot.user_id, &sent[0].0, |b| b == want).await;
    // Killed mid-reply: the next message's reply streams, two more wait behind it (recorded).
    for i in 1..4 {
        // The first of them streams for four seconds (the fake's `[slow]`: 40 words).
        let text = format!("{}before the kill {i}", if i == 1 { "[slow] " } else { "" });
        sent.push((alice.send_text(&dm, &text).await, text));
    }
    let queued = "SELECT count(*) FROM entries WHERE line LIKE '%pincer.turn-queued%'";
    let (ev, slow) = (&sent[1].0, &sent[1].1);
    probe::poll_async(Duration::from_secs(60), Duration::from_millis(20), || {
        let (a, d, b, url) = (&alice, &dm, &bot.user_id, &url);
        async move {
            let streaming = bot_messages(a, d, b).await.iter().any(|m| {
                replied(m) == Some(ev.as_str()) && m.final_body.starts_with("word0") && !answers(slow, &m.final_body)
            });
            (streaming && pg.psql(url, queued) == "2").then_some(())
        }
    })
    .await
    .expect("a reply streams with two messages waiting behind it");
    replicas[active].kill9();
    for i in 0..3 {
        let text = format!("after the kill {i}");
        sent.push((alice.send_text(&dm, &text).await, text));
    }
    let survivor = &replicas[1 - active];
    let all_answered = probe::poll_async(Duration::from_secs(120), Duration::from_millis(200), || {
        let (a, d, b, sent) = (&alice, &dm, &bot.user_id, &sent);
        async move {
            let mine = bot_messages(a, d, b).await;
            sent.iter()
                .all(|(event, text)| {
                    mine.iter().any(|m| replied(m) == Some(event.as_str()) && answers(text, &m.final_body))
                })
                .then_some(())
        }
    })
    .await;
    if all_answered.is_none() {
        let got: Vec<(Option<String>, String)> = bot_messages(&alice, &dm, &bot.user_id)
            .await
            .iter()
            .map(|m| (replied(m).map(str::to_owned), m.final_body.clone()))
            .collect();
        // What was written (the entries' types, keys and custom records) and what both replicas said.
        let rows = pg.psql(
            &url,
            "SELECT seq || ' ' || type || ' ' || coalesce(idempotency_key, '') || ' ' || \
             coalesce(substring(line from '\"customType\":\"[a-z.-]*\",\"data\":\\{\"runId\":\"[^\"]*'), '') \
             FROM entries ORDER BY transcript, seq",
        );
        panic!(
            "not every message was answered: sent {sent:?}\ngot {got:?}\nentries:\n{rows}\nthe killed replica's log:\n{}\n\
             survivor's log:\n{}",
            replicas[active].log_text(),
            survivor.log_text()
        );
    }
    assert!(survivor.log_text().contains("matrix: syncing"), "the survivor took over");
    let mine = bot_messages(&alice, &dm, &bot.user_id).await;
    assert_eq!(mine.len(), sent.len(), "one reply message per message: {mine:?}");

    // One turn each, in one chain that the real Pi library reads as Pincer does.
    let export = dir.path().join("export.toml");
    std::fs::write(&export, &config).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["transcript", "export", "--session", &key("dm", &alice.user_id), "--config"])
        .arg(&export)
        .arg("--state-dir")
        .arg(&survivor.state_dir)
        .env(TOKEN_ENV, &bot.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    let file = dir.path().join("dm.jsonl");
    std::fs::write(&file, &out.stdout).unwrap();
    let turns = user_turns(&probe::read_rows(&file));
    assert_eq!(turns.len(), sent.len());
    assert!(turns.values().all(|&n| n == 1), "{turns:?}");
    check_chain(&file);
}
