//! The Telegram channel end to end: the real `pincer gateway` process polling a fake Bot API server
//! (`pincer_testkit::fake_telegram`, real HTTP with Telegram's semantics) and answering with the fake
//! model provider. A direct message gets one reply, streamed as edits of one message; a sender not
//! on the allowlist gets no turn (logged); an update delivered again is never a second turn (also
//! across a restart); a 429 is waited out and nothing is lost; images a reply names (`MEDIA:` lines)
//! follow its text as photos, uploaded from the agent's workspace or by URL, nothing outside the
//! workspace read, and a crash between a photo's send and its receipt is finished by the restart;
//! and with the gateway SIGKILLed over and over while users send and replies stream, every message
//! has exactly one turn, exactly one delivered reply and its photo once, and every transcript is
//! chained and read alike by Pi.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly
#![allow(clippy::disallowed_methods)] // the test removes the stored offset to stage a crash before its write

use pincer_testkit::fake_openai::{FakeOpenAi, Pacing};
use pincer_testkit::fake_telegram::{FakeTelegram, PhotoSource, Sent, BOT_ID, TOKEN as TG_TOKEN};
use pincer_testkit::gateway::{GatewayProcess, StartOptions};
use pincer_testkit::probe::{self, message_text, Rng};
use pincer_testkit::{comparable, oracle_context};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const TOKEN_VAR: &str = "PINCER_TEST_TELEGRAM_TOKEN";
/// Generous: CI is slower than a laptop; nothing is asserted about durations.
const PATIENCE: Duration = Duration::from_secs(120);

fn config(fake: &FakeOpenAi, tg: &FakeTelegram, allow: &str) -> String {
    format!(
        "{}resume_attempts = 100\n\n[channels.telegram]\nbot_token_env = \"{TOKEN_VAR}\"\napi_base_url = \"{}\"\n\
         allow_from = [{allow}]\npoll_timeout_secs = 1\n",
        fake.gateway_toml(),
        tg.base_url()
    )
}

fn options() -> StartOptions {
    StartOptions { env: vec![(TOKEN_VAR.into(), TG_TOKEN.into())], ..Default::default() }
}

fn dm_key(user: i64) -> String {
    format!("agent:main:telegram:dm:{user}")
}

fn reply_to(text: &str) -> String {
    format!("Fake reply: you said \"{text}\"")
}

/// What the user sees of the fake model's reply to `text`: [`reply_to`], unless `text` has more
/// lines (`MEDIA:` ones, in these tests): then its first line, opening the quote the rest closed.
fn shown_reply(text: &str) -> String {
    match text.split_once('\n') {
        Some((first, _)) => format!("Fake reply: you said \"{first}"),
        None => reply_to(text),
    }
}

/// The image the storm's message `round` of `user` names.
fn photo_url(user: i64, round: usize) -> String {
    format!("https://example.com/{user}/{round}.png")
}

/// Waits for `f` to give something, for [`PATIENCE`] at most; panics naming `what` otherwise.
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    probe::poll(PATIENCE, Duration::from_millis(50), &mut f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// The messages in `chat` showing `text` now.
fn showing(tg: &FakeTelegram, chat: i64, text: &str) -> Vec<Sent> {
    tg.messages_in(chat).into_iter().filter(|m| m.text() == text).collect()
}

/// The messages of `chat` that show reply `text` to the user: as it is, or sent again marked "(may
/// be a duplicate)" (a kill between a final's intent and its receipt: the next process cannot know
/// whether the platform got it, and where it had not, the marked copy is the only one).
fn delivered(tg: &FakeTelegram, chat: i64, text: &str) -> Vec<Sent> {
    let marked = format!("(may be a duplicate) {text}");
    tg.messages_in(chat).into_iter().filter(|m| m.text() == text || m.text() == marked).collect()
}

/// The transcript's rows are one chain (each entry's parent is the one before it), it holds each
/// user row's key once, and Pi builds the context Pincer builds from it. Returns its rows.
fn check_transcript(file: &Path) -> Vec<Value> {
    // A deliverer may still be appending (a receipt after the reply showed): read it when it stays
    // the same while Pi reads it.
    let (text, pi) = wait_for("the transcript at rest", || {
        let text = std::fs::read_to_string(file).expect("transcript");
        let pi = oracle_context(file, None);
        (std::fs::read_to_string(file).expect("transcript") == text).then_some((text, pi))
    });
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    for (n, e) in rows.iter().enumerate().skip(2) {
        assert_eq!(
            e["parentId"],
            rows[n - 1]["id"],
            "entry {n} of {} is not chained to the one before",
            file.display()
        );
    }
    let mut keys: HashMap<String, usize> = HashMap::new();
    for e in &rows {
        if let Some(k) = e["message"]["idempotencyKey"].as_str() {
            *keys.entry(k.to_owned()).or_default() += 1;
        }
    }
    assert!(keys.values().all(|&n| n == 1), "a key was written twice in {}: {keys:?}", file.display());
    let session = pincer_store::Session::parse(text.into_bytes());
    let ours = pincer_store::context_report(&session, &pincer_store::LeafArg::Default).expect("context").to_value();
    assert_eq!(comparable(&pi), comparable(&ours), "Pi reads {} as Pincer does", file.display());
    rows
}

fn user_rows(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|e| e["type"] == "message" && e["message"]["role"] == "user").collect()
}

/// The delivery ledger's entries of one part (`first`, `final`, `media`) and phase.
fn ledger<'a>(rows: &'a [Value], phase: &str, part: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|e| e["customType"] == "pincer.channel-delivery")
        .filter(|e| e["data"]["phase"] == phase && e["data"]["part"] == part)
        .collect()
}

/// A PNG of `w`×`h` (its header; the pixels do not matter here).
fn png(w: u32, h: u32) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[8, 2, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
    b.extend_from_slice(&[0x5a; 200]);
    b
}

/// The agent's workspace (the default one, under the state directory).
fn workspace(state: &Path) -> std::path::PathBuf {
    let ws = state.join("workspace").join("main");
    std::fs::create_dir_all(&ws).expect("workspace");
    ws
}

#[test]
fn a_direct_message_gets_one_streamed_reply_and_strangers_get_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\", \"@Carol\""), &options());

    // A stranger first: no turn, no answer, a line in the log; the bot reads on past it.
    tg.push_text(2222, 2222, "mallory", "let me in");
    // `[slow]`: 40 pieces 100 ms apart, so the reply streams into its message as edits.
    let said = "[slow] hello there";
    tg.push_text(1111, 1111, "alice", said);
    let want = (0..40).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ");
    let m = wait_for("alice's reply", || showing(&tg, 1111, &want).into_iter().next());
    assert_eq!(tg.messages_in(1111).len(), 1, "one message, edited: {:?}", tg.messages_in(1111));
    assert_eq!(m.texts.first().map(String::as_str), Some("…"), "sent when the run starts: {:?}", m.texts);
    let partial: Vec<&String> = m.texts[1..m.texts.len() - 1].iter().collect();
    assert!(!partial.is_empty(), "the reply streamed as edits: {:?}", m.texts);
    assert!(partial.iter().all(|t| want.starts_with(t.as_str())), "edits show the reply so far: {:?}", m.texts);

    // A username on the allowlist works as well as an id (case ignored).
    tg.push_text(3333, 3333, "carol", "hi from carol");
    wait_for("carol's reply", || showing(&tg, 3333, &reply_to("hi from carol")).into_iter().next());

    assert!(tg.messages_in(2222).is_empty(), "the stranger got an answer: {:?}", tg.messages_in(2222));
    let index = probe::session_index(&state, "main");
    assert!(index.get(dm_key(2222)).is_none(), "the stranger got a session: {index}");
    let log = gw.log_text();
    assert!(
        log.lines().any(|l| l.contains("not on allow_from") && l.contains("2222") && l.contains("mallory")),
        "the refusal is logged: {log}"
    );
    assert!(!log.contains(TG_TOKEN), "the bot token reached the log");

    // The session is labelled for the WebChat and OpenClaw clients, and says where replies go.
    let row = &index[dm_key(1111)];
    assert_eq!(row["label"], "telegram · @alice", "{row}");
    assert_eq!(row["origin"]["provider"], "telegram", "{row}");
    assert_eq!(row["deliveryContext"]["to"], "1111", "{row}");

    // The transcript: the user row keyed by the Telegram message, the reply, the delivery ledger
    // (intent and receipt of the first message and of the final), chained; Pi reads it.
    let file = probe::transcript_path(&state, &dm_key(1111)).expect("alice's transcript");
    let rows = check_transcript(&file);
    let users = user_rows(&rows);
    assert_eq!(users.len(), 1);
    assert_eq!(users[0]["message"]["idempotencyKey"], format!("telegram-{BOT_ID}-1111-1:user"));
    assert_eq!(message_text(&users[0]["message"]), said);
    let ledger: Vec<String> = rows
        .iter()
        .filter(|e| e["customType"] == "pincer.channel-delivery")
        .map(|e| format!("{}:{}", e["data"]["phase"].as_str().unwrap_or(""), e["data"]["part"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(ledger, ["intent:first", "receipt:first", "intent:final", "receipt:final"]);
    let receipt = rows.iter().rfind(|e| e["customType"] == "pincer.channel-delivery").expect("receipt");
    assert_eq!(receipt["data"]["messageIds"], serde_json::json!([m.message_id.to_string()]));
    let context = oracle_context(&file, None);
    assert_eq!(context["context"]["messages"].as_array().map(Vec::len), Some(2), "the ledger is outside the context");

    // `pincer channels status` asks the running gateway: the bot, its state and its counters.
    let out = std::process::Command::new(BIN)
        .args(["channels", "status", "--json", "--bind", &gw.addr, "--state-dir"])
        .arg(&state)
        .env("PINCER_GATEWAY_TOKEN", pincer_testkit::gateway::TOKEN)
        .env(TOKEN_VAR, TG_TOKEN)
        .output()
        .expect("pincer channels status");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let tg_row = &status["channels"][0];
    assert_eq!(tg_row["id"], "telegram", "{status}");
    assert_eq!(tg_row["state"], "running", "{status}");
    assert_eq!(tg_row["account"], format!("@pincer_test_bot ({BOT_ID})"), "{status}");
    assert_eq!((tg_row["received"].as_u64(), tg_row["refused"].as_u64()), (Some(2), Some(1)), "{status}");
    assert!(tg_row["sent"].as_u64() >= Some(4), "two messages and their edits: {status}");
}

#[test]
fn a_redelivered_update_is_never_a_second_turn_even_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let mut gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\""), &options());
    let (update, _) = tg.push_text(1111, 1111, "alice", "only once");
    wait_for("the reply", || showing(&tg, 1111, &reply_to("only once")).into_iter().next());
    wait_for("the update confirmed", || (tg.unconfirmed() == 0).then_some(()));
    // (Its receipt on disk too: a restart before it would rightly send it again, marked.)
    wait_for("the delivery recorded", || {
        let rows = probe::transcript_rows(&state, &dm_key(1111));
        (ledger(&rows, "receipt", "final").len() == 1).then_some(())
    });

    // A new process polls from the offset it stored.
    let polls_before = tg.offsets().len();
    gw.restart();
    wait_for("the first poll after the restart", || (tg.offsets().len() > polls_before).then_some(()));
    assert_eq!(tg.offsets()[polls_before], Some(update + 1), "the restarted gateway polls from its stored offset");

    // A crash after the turn was written and before the offset was (the cursor is behind): Telegram
    // delivers the update again to the next process, which takes it as the turn it already is.
    gw.kill9();
    let cursor = state.join("channels").join(format!("telegram-{BOT_ID}.json"));
    std::fs::remove_file(&cursor).expect("the stored offset");
    tg.redeliver(update);
    gw.restart();
    wait_for("the redelivery seen after the restart", || gw.log_text().contains("no second turn").then_some(()));
    tg.push_text(1111, 1111, "alice", "and then this");
    wait_for("the next reply", || showing(&tg, 1111, &reply_to("and then this")).into_iter().next());

    let rows = check_transcript(&probe::transcript_path(&state, &dm_key(1111)).expect("transcript"));
    assert_eq!(user_rows(&rows).len(), 2, "two messages, two turns");
    assert_eq!(showing(&tg, 1111, &reply_to("only once")).len(), 1, "{:?}", tg.messages_in(1111));
    assert_eq!(tg.messages_in(1111).len(), 2, "{:?}", tg.messages_in(1111));
    assert_eq!(fake.requests().len(), 2, "the model was asked once per message");
}

#[test]
fn a_429_is_waited_out_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\""), &options());
    wait_for("the first poll", || tg.calls().iter().any(|(m, _)| m == "getUpdates").then_some(()));
    tg.fail_next("sendMessage", 2, 1);
    tg.fail_next("getUpdates", 1, 1);
    tg.push_text(1111, 1111, "alice", "slowly please");
    wait_for("the reply", || showing(&tg, 1111, &reply_to("slowly please")).into_iter().next());
    let sends = tg.calls().iter().filter(|(m, _)| m == "sendMessage").count();
    assert_eq!(sends, 3, "two refused with 429, then the one that went through");
    assert_eq!(tg.messages_in(1111).len(), 1, "{:?}", tg.messages_in(1111));
    let log = gw.log_text();
    assert!(log.contains("429") && log.contains("retry_after"), "{log}");
    let rows = check_transcript(&probe::transcript_path(&state, &dm_key(1111)).expect("transcript"));
    assert_eq!(user_rows(&rows).len(), 1);
}

#[test]
fn a_storm_of_sigkills_loses_and_duplicates_nothing() {
    // Four people each send five messages while the gateway is SIGKILLed at random moments (at least
    // ten times) and started again; replies stream word by word, and each names an image (a URL).
    // In the end every message has one turn, one delivered reply and its photo once.
    const USERS: i64 = 4;
    const EACH: usize = 5;
    const KILLS: usize = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread_paced(Pacing {
        first: Duration::from_millis(100),
        word: Duration::from_millis(80),
        slow: Duration::from_millis(100),
    });
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let allow: Vec<String> = (1..=USERS).map(|u| format!("\"{}\"", 5000 + u)).collect();
    let mut gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, &allow.join(", ")), &options());
    let mut rng = Rng(0x5eed_7e1e);
    let mut sent: Vec<(i64, String)> = Vec::new();
    let mut kills = 0;
    let started = Instant::now();
    for round in 0..EACH {
        for u in 1..=USERS {
            let user = 5000 + u;
            let text = format!("message {round} from user {u}\nMEDIA:{}", photo_url(user, round));
            tg.push_text(user, user, &format!("user{u}"), &text);
            sent.push((user, text));
        }
        // Two kills per round, at random moments while the replies stream.
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(rng.range(200, 1500)));
            gw.restart();
            kills += 1;
        }
    }
    assert!(kills >= KILLS, "only {kills} kills");
    for (user, text) in &sent {
        let want = shown_reply(text);
        let got = probe::poll(PATIENCE, Duration::from_millis(50), || {
            (!delivered(&tg, *user, &want).is_empty()).then_some(())
        });
        if got.is_none() {
            // What the last process did and what the transcript holds, to tell why.
            eprintln!("--- gateway log:\n{}\n--- transcript of {user}:", gw.log_text());
            for e in probe::transcript_rows(&state, &dm_key(*user)) {
                eprintln!("{} {} {} {}", e["type"], e["customType"], e["data"], e["message"]["idempotencyKey"]);
            }
            panic!("no reply to {text:?}: {:?}", tg.messages_in(*user));
        }
    }
    // Deliveries a dying process left half-done are finished by the next one: let the last one
    // settle (every final receipt, and every photo's, on disk) before counting.
    wait_for("every delivery recorded", || {
        let done = (1..=USERS).all(|u| {
            let rows = probe::transcript_rows(&state, &dm_key(5000 + u));
            ledger(&rows, "receipt", "final").len() >= EACH && ledger(&rows, "receipt", "media").len() >= EACH
        });
        done.then_some(())
    });
    let (mut placeholders, mut marked, mut marked_photos, mut only_marked) = (0, 0, 0, 0);
    for u in 1..=USERS {
        let user = 5000 + u;
        let msgs = tg.messages_in(user);
        let photos = tg.photos_in(user);
        let (mut only_marked_here, mut plain_replies) = (0, 0);
        for (round, (_, text)) in sent.iter().filter(|(c, _)| *c == user).enumerate() {
            // Its photo: there, never twice as it is; another copy only ever marked as one. (A kill
            // after the photo's intent and before Telegram got it leaves only the marked copy:
            // the next process cannot know, so it sends it marked.)
            let url = PhotoSource::Url(photo_url(user, round));
            let copies: Vec<_> = photos.iter().filter(|p| p.source == url).collect();
            let plain = copies.iter().filter(|p| p.caption.is_none()).count();
            assert!(!copies.is_empty() && plain <= 1, "the photo of {text:?} was sent {plain} times: {photos:?}");
            assert!(copies.iter().all(|p| p.caption.as_deref().is_none_or(|c| c == "(may be a duplicate)")));
            marked_photos += copies.len() - plain;
            only_marked_here += usize::from(plain == 0);
            let want = shown_reply(text);
            let exact = msgs.iter().filter(|m| m.text() == want).count();
            // Never twice as it is; another copy only ever marked as one (and, where the platform
            // never got the first send, the marked copy is the only one).
            let copies = msgs.iter().filter(|m| m.text().contains(&want)).count();
            assert!(exact <= 1 && copies >= 1, "the reply to {text:?} was delivered {exact} times: {msgs:?}");
            marked += copies - exact;
            plain_replies += exact;
            assert!(
                msgs.iter()
                    .filter(|m| m.text().contains(&want) && m.text() != want)
                    .all(|m| m.text().starts_with("(may be a duplicate)")),
                "an unmarked copy of {want:?}: {msgs:?}"
            );
        }
        let orphans = msgs.iter().filter(|m| m.text() == "…").count();
        placeholders += orphans;
        let rows = check_transcript(&probe::transcript_path(&state, &dm_key(user)).expect("transcript"));
        // A bare placeholder stays behind only where a kill came between its send and its receipt.
        let unconfirmed = ledger(&rows, "intent", "first").len() - ledger(&rows, "receipt", "first").len();
        assert!(
            orphans <= unconfirmed,
            "user {u}: {orphans} bare placeholders, {unconfirmed} unconfirmed sends: {msgs:?}"
        );
        // So is a photo sent again: only where a kill came between its send and its receipt.
        let unconfirmed = ledger(&rows, "intent", "media").len() - ledger(&rows, "receipt", "media").len();
        let again = photos.iter().filter(|p| p.caption.is_some()).count();
        assert!(again <= unconfirmed, "user {u}: {again} photos sent again, {unconfirmed} unconfirmed sends");
        // Nothing else: each photo is one of the messages', as it is or a copy marked as one.
        assert_eq!(photos.len() + only_marked_here, EACH + again, "user {u}: stray photos: {photos:?}");
        only_marked += only_marked_here;
        // Nothing else: each message is a reply, a copy marked as one, or such a placeholder.
        let marked_here = msgs.iter().filter(|m| m.text().starts_with("(may be a duplicate)")).count();
        assert_eq!(msgs.len(), plain_replies + marked_here + orphans, "user {u}: stray messages: {msgs:?}");
        let users = user_rows(&rows);
        assert_eq!(users.len(), EACH, "user {u}: {EACH} messages, {EACH} turns: {users:?}");
        for (i, (_, text)) in sent.iter().filter(|(c, _)| *c == user).enumerate() {
            assert_eq!(message_text(&users[i]["message"]), *text, "in order");
        }
    }
    eprintln!(
        "storm: {} messages, {kills} SIGKILLs, {} s; {} model requests; {placeholders} placeholder(s) orphaned by a kill \
         between send and receipt, {marked} copies marked as possible duplicates, {marked_photos} photo(s) sent again \
         marked ({only_marked} of them there only marked)",
        sent.len(),
        started.elapsed().as_secs(),
        fake.requests().len()
    );
}

#[test]
fn groups_answer_when_mentioned_and_commands_and_photos_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\""), &options());
    let group = -100_500;
    let group_key = format!("agent:main:telegram:group:{group}");

    // In a group: chatter is not for the bot; a mention or a reply to the bot is (the mention is
    // not part of the message); a stranger's mention is refused.
    tg.push_text(group, 1111, "alice", "just chatting among ourselves");
    tg.push_text(group, 2222, "mallory", "@pincer_test_bot let me in");
    tg.push_text(group, 1111, "alice", "@pincer_test_bot what is up");
    let (_, _) = tg.push_message(
        group,
        1111,
        "alice",
        serde_json::json!({"text": "and this?", "reply_to_message": {"message_id": 1,
            "from": {"id": BOT_ID, "is_bot": true, "first_name": "Pincer"}, "chat": {"id": group}}}),
    );
    wait_for("the reply to the mention", || showing(&tg, group, &reply_to("what is up")).into_iter().next());
    wait_for("the reply to the reply", || showing(&tg, group, &reply_to("and this?")).into_iter().next());
    let rows = check_transcript(&probe::transcript_path(&state, &group_key).expect("the group's transcript"));
    let said: Vec<String> = user_rows(&rows).iter().map(|e| message_text(&e["message"])).collect();
    assert_eq!(said, ["what is up", "and this?"], "only what was for the bot, from allowed senders");
    assert_eq!(probe::session_index(&state, "main")[&group_key]["label"], format!("telegram · group {group}"));
    assert!(gw.log_text().contains("mallory"), "the stranger in the group is logged");

    // A photo with a caption reaches the model as an image.
    let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[7u8; 64]].concat();
    let photo = tg.add_photo("photo-1", png);
    tg.push_message(1111, 1111, "alice", serde_json::json!({"photo": photo, "caption": "what is this"}));
    wait_for("the reply to the photo", || showing(&tg, 1111, &reply_to("what is this")).into_iter().next());
    let rows = probe::transcript_rows(&state, &dm_key(1111));
    let image = user_rows(&rows)[0]["message"]["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "image").cloned())
        .expect("an image block");
    assert_eq!(image["mimeType"], "image/png");

    // /stop stops the streaming reply; its message ends as what was said so far, marked.
    tg.push_text(1111, 1111, "alice", "[slow] a long story");
    wait_for("the story streaming", || {
        tg.messages_in(1111).iter().find(|m| m.texts.len() >= 2 && m.text().starts_with("word")).cloned()
    });
    tg.push_text(1111, 1111, "alice", "/stop");
    wait_for("the stop answered", || showing(&tg, 1111, "Stopped.").into_iter().next());
    wait_for("the story's message marked stopped", || {
        tg.messages_in(1111).into_iter().find(|m| m.text().starts_with("word") && m.text().ends_with("(stopped)"))
    });

    // /new starts a new session: the answer comes, the old transcript is kept, the next message
    // goes to the new one.
    let old = probe::transcript_path(&state, &dm_key(1111)).expect("transcript");
    tg.push_text(1111, 1111, "alice", "/new");
    wait_for("the new session", || {
        tg.messages_in(1111).into_iter().find(|m| m.text().starts_with("Started a new session"))
    });
    tg.push_text(1111, 1111, "alice", "fresh start");
    wait_for("the reply in the new session", || showing(&tg, 1111, &reply_to("fresh start")).into_iter().next());
    let new = probe::transcript_path(&state, &dm_key(1111)).expect("transcript");
    assert_ne!(old, new);
    let rows = check_transcript(&new);
    let said: Vec<String> = user_rows(&rows).iter().map(|e| message_text(&e["message"])).collect();
    assert_eq!(said, ["fresh start"]);
    assert_eq!(
        probe::session_index(&state, "main")[dm_key(1111)]["deliveryContext"]["to"],
        "1111",
        "a new session still knows where replies go"
    );
    // Nothing was sent twice, and no placeholder was left: each message is an answer.
    for m in tg.messages_in(1111) {
        assert_ne!(m.text(), "…", "{:?}", tg.messages_in(1111));
    }
}

#[test]
fn images_a_reply_names_follow_its_text_as_photos_and_nothing_outside_the_workspace_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let ws = workspace(&state);
    let chart = png(640, 480);
    std::fs::write(ws.join("chart.png"), &chart).expect("chart");
    std::fs::write(ws.join("notes.txt"), "not an image").expect("notes");
    std::fs::write(dir.path().join("secret.png"), png(10, 10)).expect("secret");
    std::os::unix::fs::symlink(dir.path().join("secret.png"), ws.join("leak.png")).expect("symlink");
    let gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\""), &options());
    tg.unreachable_url("https://example.com/gone.png");

    // The fake model says back what it is told: the reply names eight images, each on its own line.
    let refused = [
        ("../secret.png", "outside the workspace"),
        ("leak.png", "outside the workspace"),
        ("/etc/passwd", "outside the agent's workspace"),
        ("notes.txt", "not a PNG, JPEG, GIF or WebP image"),
        ("https://127.0.0.1/x.png", "private network"),
        ("https://example.com/gone.png", "failed to get HTTP URL content"),
    ];
    let mut said = "here you go\nMEDIA:chart.png\nMEDIA:https://example.com/cat.jpg".to_owned();
    for (source, _) in refused {
        said.push_str(&format!("\nMEDIA:{source}"));
    }
    tg.push_text(1111, 1111, "alice", &said);
    let text = "Fake reply: you said \"here you go";
    let m = wait_for("the reply's text", || showing(&tg, 1111, text).into_iter().next());
    let file = probe::transcript_path(&state, &dm_key(1111)).expect("transcript");
    let rows = wait_for("every image settled", || {
        let rows = probe::read_rows_lossy(&file).0;
        (ledger(&rows, "receipt", "media").len() == 8).then_some(rows)
    });

    // The two images that may go went as photos, after the text, once each: the workspace file
    // uploaded (its bytes, name and type), the URL handed to Telegram.
    let photos = tg.photos_in(1111);
    assert_eq!(photos.len(), 2, "{photos:?}");
    assert_eq!(
        photos[0].source,
        PhotoSource::Upload { bytes: chart.clone(), filename: "chart.png".into(), content_type: "image/png".into() }
    );
    assert_eq!(photos[1].source, PhotoSource::Url("https://example.com/cat.jpg".into()));
    assert!(photos.iter().all(|p| p.caption.is_none() && p.message_id > m.message_id), "{photos:?}");
    let calls: Vec<String> = tg.calls().into_iter().map(|(method, _)| method).collect();
    // (The text's last call is the final edit of the message it streamed into, or the message
    // itself when the run was over before it could stream.)
    let text_done = calls.iter().rposition(|c| c == "editMessageText" || c == "sendMessage").expect("the text");
    let first_photo = calls.iter().position(|c| c == "sendPhoto").expect("a photo");
    assert!(text_done < first_photo, "the text is whole before the photos: {calls:?}");
    // The directives never showed, not even while the reply streamed.
    assert_eq!(tg.messages_in(1111).len(), 1, "{:?}", tg.messages_in(1111));
    assert!(m.texts.iter().all(|t| !t.contains("MEDIA")), "{:?}", m.texts);

    // Each image that could not go is in the log, saying why, and settled in the ledger.
    let log = gw.log_text();
    for (source, why) in refused {
        assert!(
            log.lines().any(|l| l.contains("a reply's image was not sent") && l.contains(source) && l.contains(why)),
            "no log line for {source} ({why}):\n{log}"
        );
    }
    assert_eq!(ledger(&rows, "receipt", "final")[0]["data"]["media"], 8);
    let receipts = ledger(&rows, "receipt", "media");
    let sent: Vec<&Value> = receipts.iter().copied().filter(|r| r["data"]["failed"].is_null()).collect();
    assert_eq!(sent.len(), 2, "{receipts:?}");
    let ids: Vec<String> = photos.iter().map(|p| p.message_id.to_string()).collect();
    assert_eq!(sent.iter().map(|r| r["data"]["messageIds"][0].as_str().unwrap_or("")).collect::<Vec<_>>(), ids);
    // Only the images that were tried have an intent: the refused files were never sent.
    assert_eq!(ledger(&rows, "intent", "media").len(), 3, "chart.png, cat.jpg and gone.png");
    check_transcript(&file);
}

#[test]
fn a_photo_cut_by_a_crash_before_its_receipt_is_sent_again_marked_and_the_rest_follow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let chart = png(300, 200);
    std::fs::write(workspace(&state).join("chart.png"), &chart).expect("chart");
    let mut gw = GatewayProcess::start_with(BIN, &state, &config(&fake, &tg, "\"1111\""), &options());

    // Telegram takes the first photo, and its answer never reaches the gateway: killed meanwhile.
    tg.hold("sendPhoto");
    tg.push_text(1111, 1111, "alice", "two pictures\nMEDIA:chart.png\nMEDIA:https://example.com/cat.jpg");
    wait_for("the first photo taken", || (tg.photos_in(1111).len() == 1).then_some(()));
    gw.kill9();
    let file = probe::transcript_path(&state, &dm_key(1111)).expect("transcript");
    let rows = probe::read_rows(&file);
    assert_eq!(ledger(&rows, "receipt", "final").len(), 1, "the text was delivered before");
    assert_eq!((ledger(&rows, "intent", "media").len(), ledger(&rows, "receipt", "media").len()), (1, 0));

    // The next process finishes the delivery: the photo whose fate it cannot know again, marked, and
    // the one never sent; the text is not sent again.
    tg.release("sendPhoto");
    gw.restart();
    let rows = wait_for("the delivery finished", || {
        let rows = probe::read_rows_lossy(&file).0;
        (ledger(&rows, "receipt", "media").len() == 2).then_some(rows)
    });
    let photos = tg.photos_in(1111);
    let upload = PhotoSource::Upload { bytes: chart, filename: "chart.png".into(), content_type: "image/png".into() };
    let seen: Vec<(&PhotoSource, Option<&str>)> = photos.iter().map(|p| (&p.source, p.caption.as_deref())).collect();
    assert_eq!(
        seen,
        [
            (&upload, None),
            (&upload, Some("(may be a duplicate)")),
            (&PhotoSource::Url("https://example.com/cat.jpg".into()), None)
        ]
    );
    assert_eq!(tg.messages_in(1111).len(), 1, "{:?}", tg.messages_in(1111));
    assert_eq!(tg.messages_in(1111)[0].text(), "Fake reply: you said \"two pictures");
    assert!(gw.log_text().contains("may have been sent before a crash"), "{}", gw.log_text());
    assert_eq!(ledger(&rows, "intent", "media").len(), 3);
    check_transcript(&file);

    // Delivered: a third process sends nothing more.
    let calls = tg.calls().iter().filter(|(m, _)| m == "sendPhoto").count();
    gw.restart();
    wait_for("a poll of the third process", || gw.log_text().contains("telegram: polling for messages").then_some(()));
    tg.push_text(1111, 1111, "alice", "anything else?");
    wait_for("the next reply", || showing(&tg, 1111, &reply_to("anything else?")).into_iter().next());
    assert_eq!(tg.calls().iter().filter(|(m, _)| m == "sendPhoto").count(), calls, "no photo sent again");
}

#[test]
fn with_two_postgres_replicas_one_polls_and_a_survivor_takes_over_through_a_storm() {
    // The same storm on two replicas of one PostgreSQL database: one replica at a time holds the
    // bot's lease (it polls and delivers), the other stands by. The holder is SIGKILLed again and
    // again (and started again, as the stand-by); the other takes over, resumes the cut turns and
    // delivers their replies. Every message has one turn and one delivered reply.
    use pincer_testkit::postgres::Postgres;
    const USERS: i64 = 3;
    const EACH: usize = 4;
    const KILLS: usize = 10;
    let pg = Postgres::shared();
    let url = pg.database("channels");
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread_paced(Pacing {
        first: Duration::from_millis(100),
        word: Duration::from_millis(80),
        slow: Duration::from_millis(100),
    });
    let tg = FakeTelegram::start_in_thread();
    let allow: Vec<String> = (1..=USERS).map(|u| format!("\"{}\"", 7000 + u)).collect();
    let config = format!(
        "{}\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\npool_size = 8\n",
        config(&fake, &tg, &allow.join(", "))
    );
    let mut replicas: Vec<GatewayProcess> = (0..2)
        .map(|i| {
            let mut o = options();
            o.env.push(("PINCER_REPLICA_ID".into(), format!("replica-{i}")));
            GatewayProcess::start_with(BIN, &dir.path().join(format!("r{i}")), &config, &o)
        })
        .collect();
    let polling = |r: &GatewayProcess| r.log_text().contains("telegram: polling for messages");
    let holder = |replicas: &[GatewayProcess]| {
        wait_for("a replica holding the bot's lease", || replicas.iter().position(polling))
    };
    let first = holder(&replicas);
    assert!(
        wait_for("the other standing by", || replicas[1 - first].log_text().contains("standing by").then_some(true)),
        "one replica polls at a time"
    );
    let mut rng = Rng(0x0b5e_55ed);
    let mut sent: Vec<(i64, String)> = Vec::new();
    let mut kills = 0;
    for round in 0..EACH {
        for u in 1..=USERS {
            let user = 7000 + u;
            let text = format!("message {round} from user {u}");
            tg.push_text(user, user, &format!("user{u}"), &text);
            sent.push((user, text));
        }
        for _ in 0..(KILLS.div_ceil(EACH)) {
            std::thread::sleep(Duration::from_millis(rng.range(300, 1500)));
            let h = holder(&replicas);
            replicas[h].restart();
            kills += 1;
        }
    }
    assert!(kills >= KILLS, "only {kills} kills");
    for (user, text) in &sent {
        let want = reply_to(text);
        let got = probe::poll(PATIENCE, Duration::from_millis(50), || {
            (!delivered(&tg, *user, &want).is_empty()).then_some(())
        });
        if got.is_none() {
            for (i, r) in replicas.iter().enumerate() {
                eprintln!("--- replica {i}:\n{}", r.log_text());
            }
            let out = std::process::Command::new(BIN)
                .args(["transcript", "export", "--session", &dm_key(*user), "--config"])
                .arg(dir.path().join("r0").join("pincer.toml"))
                .arg("--state-dir")
                .arg(dir.path().join("r0"))
                .env(TOKEN_VAR, TG_TOKEN)
                .output()
                .expect("export");
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                let e: Value = serde_json::from_str(l).unwrap_or_default();
                eprintln!(
                    "{} {} {} {} {} {}",
                    e["id"],
                    e["parentId"],
                    e["type"],
                    e["customType"],
                    e["data"]["runId"],
                    e["message"]["idempotencyKey"]
                );
            }
            panic!("no reply to {text:?}: {:?}", tg.messages_in(*user));
        }
    }
    // Only the holder polls: the replicas' logs say so (one of them at a time, several times over).
    let export = |key: &str| {
        let out = std::process::Command::new(BIN)
            .args(["transcript", "export", "--session", key, "--config"])
            .arg(dir.path().join("r0").join("pincer.toml"))
            .arg("--state-dir")
            .arg(dir.path().join("r0"))
            .env(TOKEN_VAR, TG_TOKEN)
            .output()
            .expect("export");
        assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
        let file = dir.path().join(format!("{}.jsonl", key.replace(':', "_")));
        std::fs::write(&file, &out.stdout).expect("write the export");
        file
    };
    wait_for("every delivery recorded", || {
        let done = (1..=USERS).all(|u| {
            let rows = probe::read_rows(&export(&dm_key(7000 + u)));
            let finals = rows
                .iter()
                .filter(|e| e["customType"] == "pincer.channel-delivery" && e["data"]["phase"] == "receipt")
                .filter(|e| e["data"]["part"] == "final")
                .count();
            finals >= EACH
        });
        done.then_some(())
    });
    for u in 1..=USERS {
        let user = 7000 + u;
        let msgs = tg.messages_in(user);
        let mut plain_replies = 0;
        for (_, text) in sent.iter().filter(|(c, _)| *c == user) {
            let want = reply_to(text);
            let exact = msgs.iter().filter(|m| m.text() == want).count();
            let shown = delivered(&tg, user, &want).len();
            assert!(exact <= 1 && shown >= 1, "the reply to {text:?} was delivered {exact} times: {msgs:?}");
            plain_replies += exact;
        }
        let marked = msgs.iter().filter(|m| m.text().starts_with("(may be a duplicate)")).count();
        let orphans = msgs.iter().filter(|m| m.text() == "…").count();
        assert_eq!(msgs.len(), plain_replies + marked + orphans, "user {u}: stray messages: {msgs:?}");
        let rows = check_transcript(&export(&dm_key(user)));
        let users = user_rows(&rows);
        assert_eq!(users.len(), EACH, "user {u}: {EACH} messages, {EACH} turns: {users:?}");
    }
    let offsets = pg.psql(&url, "SELECT cursor FROM channel_cursors");
    assert!(offsets.trim().parse::<i64>().is_ok(), "the offset is in the database: {offsets:?}");
    eprintln!("replica storm: {} messages, {kills} SIGKILLs of the polling replica", sent.len());
}

#[test]
fn a_webhook_takes_each_update_once_and_refuses_a_wrong_secret() {
    const SECRET_VAR: &str = "PINCER_TEST_TELEGRAM_WEBHOOK_TOKEN";
    const SECRET: &str = "webhook-secret_0123456789";
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let tg = FakeTelegram::start_in_thread();
    let state = dir.path().join("state");
    let config = format!(
        "{}webhook_url = \"https://bot.example.com/api/channels/telegram/webhook\"\nwebhook_secret_env = \"{SECRET_VAR}\"\n",
        config(&fake, &tg, "\"1111\"")
    );
    let mut o = options();
    o.env.push((SECRET_VAR.into(), SECRET.into()));
    let gw = GatewayProcess::start_with(BIN, &state, &config, &o);
    let (url, secret) = wait_for("setWebhook", || tg.webhook());
    assert_eq!((url.as_str(), secret.as_str()), ("https://bot.example.com/api/channels/telegram/webhook", SECRET));
    // The URL's host is the public name; here the fake reaches the gateway directly.
    tg.set_webhook_target(&gw.addr);
    let (update, _) = tg.push_text(1111, 1111, "alice", "hello by webhook");
    wait_for("the reply", || showing(&tg, 1111, &reply_to("hello by webhook")).into_iter().next());

    // Without the secret token nobody can make a turn.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let forged = serde_json::json!({"update_id": 1, "message": {"message_id": 99, "date": 1, "text": "forged",
        "chat": {"id": 1111, "type": "private"}, "from": {"id": 1111, "is_bot": false, "first_name": "alice"}}});
    assert_eq!(rt.block_on(tg.post_webhook(&forged, "not-the-secret")), 401);
    assert_eq!(rt.block_on(tg.post_webhook(&forged, "")), 401);

    // Telegram sends an update again (its answer was lost): the same turn, answered 200 again.
    tg.redeliver(update);
    wait_for("the redelivery seen", || gw.log_text().contains("no second turn").then_some(()));
    wait_for("the redelivery confirmed", || (tg.unconfirmed() == 0).then_some(()));
    let rows = check_transcript(&probe::transcript_path(&state, &dm_key(1111)).expect("transcript"));
    let said: Vec<String> = user_rows(&rows).iter().map(|e| message_text(&e["message"])).collect();
    assert_eq!(said, ["hello by webhook"]);
    assert_eq!(tg.messages_in(1111).len(), 1, "{:?}", tg.messages_in(1111));
    assert!(!tg.calls().iter().any(|(m, _)| m == "getUpdates"), "no polling with a webhook");
    let log = gw.log_text();
    assert!(!log.contains(SECRET) && !log.contains(TG_TOKEN), "a secret reached the log");
}
