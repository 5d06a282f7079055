//! The paging the WebChat relies on, over the protocol against the real `pincer gateway` process:
//! `chat.history {beforeEntryId}` gives the window before an entry with `hasOlder`, down to the
//! first message; `sessions.list {onlyArchived}` lists the archived sessions alone (the page's
//! "Archived" section pages through them whatever their age); renaming, archiving and restoring
//! leave a session where it was in the list; a slash command is not a chat's title; a deleted
//! chat's transcript (`sessions.archives.get`) pages back like `chat.history` and comes back as a
//! chat of its own (`sessions.archives.restore`, a write); bad values are refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

fn texts(h: &Value) -> Vec<String> {
    (h["messages"].as_array().expect("messages").iter())
        .map(|m| m["content"][0]["text"].as_str().or(m["content"].as_str()).unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_windows_and_archived_pages_over_the_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &fake.gateway_toml());
    let mut c = Client::connect(&gw.addr).await;

    c.request("sessions.create", json!({"key": "long"})).await.expect("create");
    for i in 0..25 {
        c.request("chat.inject", json!({"sessionKey": "long", "message": format!("row {i}")})).await.expect("inject");
    }
    let mut got: Vec<String> = Vec::new();
    let mut params = json!({"sessionKey": "long", "limit": 10});
    let mut windows = 0;
    loop {
        let h = c.request("chat.history", params.clone()).await.expect("history");
        windows += 1;
        let mut t = texts(&h);
        t.append(&mut got);
        got = t;
        if h["hasOlder"] != true {
            assert_eq!(h["hasOlder"], false, "{h}");
            break;
        }
        params["beforeEntryId"] = h["messages"][0]["__openclaw"]["id"].clone();
    }
    assert_eq!(windows, 3);
    assert_eq!(got, (0..25).map(|i| format!("row {i}")).collect::<Vec<_>>());

    let e = c.request("chat.history", json!({"sessionKey": "long", "beforeEntryId": " "})).await.expect_err("blank");
    assert!(e["message"].as_str().expect("msg").contains("at /beforeEntryId"), "{e}");

    // Three sessions, the oldest two archived: onlyArchived lists just those, paged by offset.
    for k in ["a", "b"] {
        c.request("sessions.create", json!({"key": k})).await.expect("create");
        c.request("sessions.patch", json!({"key": k, "archived": true})).await.expect("archive");
    }
    let keys = |l: &Value| -> Vec<String> {
        l["sessions"].as_array().expect("rows").iter().map(|r| r["key"].as_str().expect("key").to_owned()).collect()
    };
    let l = c.request("sessions.list", json!({"onlyArchived": true})).await.expect("list");
    let mut archived = keys(&l);
    archived.sort();
    assert_eq!(archived, ["agent:main:a", "agent:main:b"]);
    let l = c.request("sessions.list", json!({"onlyArchived": true, "limit": 1, "offset": 1})).await.expect("list");
    assert_eq!((keys(&l).len(), l["hasMore"].as_bool(), l["totalCount"].as_u64()), (1, Some(false), Some(2)));
    let l = c.request("sessions.list", json!({})).await.expect("list");
    assert!(keys(&l).iter().all(|k| k != "agent:main:a" && k != "agent:main:b"), "{l}");
    // A rename, an archive and a restore keep the order (updatedAt); a model change is activity.
    let before = keys(&c.request("sessions.list", json!({"includeArchived": true})).await.expect("list"));
    let stamp = |l: &Value, k: &str| {
        l["sessions"].as_array().expect("rows").iter().find(|r| r["key"] == k).expect("row")["updatedAt"].clone()
    };
    let l0 = c.request("sessions.list", json!({"includeArchived": true})).await.expect("list");
    c.request("sessions.patch", json!({"key": "a", "label": "Renamed"})).await.expect("rename");
    c.request("sessions.patch", json!({"key": "a", "archived": false})).await.expect("restore");
    c.request("sessions.patch", json!({"key": "long", "archived": true})).await.expect("archive");
    let l1 = c.request("sessions.list", json!({"includeArchived": true})).await.expect("list");
    assert_eq!(keys(&l1), before, "the order is kept");
    assert_eq!(stamp(&l1, "agent:main:a"), stamp(&l0, "agent:main:a"));
    c.request("sessions.patch", json!({"key": "long", "model": "fake/fake-model"})).await.expect("model");
    let l2 = c.request("sessions.list", json!({"includeArchived": true})).await.expect("list");
    assert_eq!(keys(&l2)[0], "agent:main:long", "a model change moves it to the top");
    let e = c.request("sessions.list", json!({"onlyArchived": 1})).await.expect_err("bad");
    assert!(e["message"].as_str().expect("msg").contains("at /onlyArchived"), "{e}");

    // The deleted chat's transcript, in windows too.
    c.request("sessions.delete", json!({"key": "long"})).await.expect("delete");
    let a = c.request("sessions.archives.list", json!({})).await.expect("archives");
    let file = (a["archives"].as_array().expect("archives").iter())
        .find(|r| r["reason"] == "deleted" && r["messageCount"] == 25)
        .map(|r| r["file"].clone())
        .expect("the deleted transcript");
    let mut got: Vec<String> = Vec::new();
    let mut params = json!({"file": file, "limit": 10});
    loop {
        let h = c.request("sessions.archives.get", params.clone()).await.expect("archive window");
        assert!(h["messages"].as_array().expect("messages").len() <= 10, "a window of the limit: {h}");
        let mut t = texts(&h);
        t.append(&mut got);
        got = t;
        if h["hasOlder"] != true {
            break;
        }
        params["beforeEntryId"] = h["messages"][0]["__openclaw"]["id"].clone();
    }
    assert_eq!(got, (0..25).map(|i| format!("row {i}")).collect::<Vec<_>>());

    // Restored: a new chat with every message; the archived file stays listed. A read-only client
    // cannot, and a name not in the listing is refused by name.
    let mut params = pincer_testkit::gateway::connect_params(pincer_testkit::gateway::TOKEN);
    params["scopes"] = json!(["operator.read"]);
    let mut reader = Client::connect_with(&gw.addr, params).await.expect("read-only client");
    let e = reader.request("sessions.archives.restore", json!({"file": file})).await.expect_err("read-only");
    assert!(e["message"].as_str().expect("msg").contains("operator.write"), "{e}");
    let e = c.request("sessions.archives.restore", json!({"file": "../sessions.json"})).await.expect_err("bad");
    assert_eq!(e["message"], "archived transcript not found: ../sessions.json");
    let r = c.request("sessions.archives.restore", json!({"file": file})).await.expect("restore");
    let key = r["key"].as_str().expect("key").to_owned();
    let h = c.request("chat.history", json!({"sessionKey": key})).await.expect("history");
    assert_eq!(texts(&h), (0..25).map(|i| format!("row {i}")).collect::<Vec<_>>());
    let a = c.request("sessions.archives.list", json!({})).await.expect("archives");
    assert!(a["archives"].as_array().expect("archives").iter().any(|r| r["file"] == file), "the archive stays");

    // A chat begun with /status is titled by its first real message.
    c.request("sessions.create", json!({"key": "cmd"})).await.expect("create");
    for (said, run) in [("/status", "s1"), ("What is a pincer?", "s2")] {
        c.request("chat.send", json!({"sessionKey": "cmd", "message": said, "idempotencyKey": run}))
            .await
            .expect("send");
        assert_eq!(c.chat_end(run).await["payload"]["state"], "final");
    }
    let d =
        c.request("sessions.describe", json!({"key": "cmd", "includeDerivedTitles": true})).await.expect("describe");
    assert_eq!(d["session"]["derivedTitle"], "What is a pincer?", "{d}");
    let l = c.request("sessions.list", json!({"includeDerivedTitles": true})).await.expect("list");
    let row =
        l["sessions"].as_array().expect("rows").iter().find(|r| r["key"] == "agent:main:cmd").cloned().expect("row");
    assert_eq!(row["derivedTitle"], "What is a pincer?");
}
