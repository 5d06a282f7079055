//! `sessions.search`, `sessions.export` and `GET /api/sessions/{key}/export` against the real
//! `pincer gateway` process: a reply written by a turn is found by the next search (the indexer
//! runs beside the append path, and the search waits for it), in OpenClaw's result shape with
//! Pincer's `entryId`; archived sessions only on request; a read-only connection may search and
//! export; the HTTP export needs the token and names what is wrong; what the gateway exports is
//! the file on disk.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{connect_params, Client, GatewayProcess, TOKEN};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

async fn turn(c: &mut Client, key: &str, message: &str, run: &str) {
    c.request("chat.send", json!({"sessionKey": key, "message": message, "idempotencyKey": run}))
        .await
        .expect("chat.send");
    assert_eq!(c.chat_end(run).await["payload"]["state"], "final");
}

async fn get(url: &str, token: Option<&str>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    pincer_agent::install_crypto_provider();
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers =
        resp.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect::<Vec<_>>();
    (status, headers, resp.bytes().await.expect("body").to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_and_export_over_the_protocol_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &fake.gateway_toml());
    let mut c = Client::connect(&gw.addr).await;
    turn(&mut c, "main", "tell me about the axolotl please", "r1").await;
    turn(&mut c, "agent:main:other", "what about the capybara", "r2").await;

    let r = c.request("sessions.search", json!({"query": "axolotl"})).await.unwrap();
    let results = r["results"].as_array().unwrap().clone();
    // The user message and the fake reply that repeats it.
    assert_eq!(results.len(), 2, "{r}");
    for h in &results {
        assert_eq!(h["sessionKey"], "agent:main:main");
        assert_eq!(h["messageId"], h["entryId"]);
        assert!(matches!(h["role"].as_str(), Some("user" | "assistant")), "{h}");
        assert!(h["snippet"].as_str().unwrap().contains("axolotl"), "{h}");
        assert!(h["timestamp"].as_u64().unwrap() > 0 && h["score"].is_number(), "{h}");
        assert_eq!(h["title"], "tell me about the axolotl please");
    }
    assert_eq!(r["truncated"], false);
    let one = c.request("sessions.search", json!({"query": "axolotl", "limit": 1})).await.unwrap();
    assert_eq!(one["results"].as_array().unwrap().len(), 1);
    assert_eq!(one["truncated"], true);
    let phrase = c.request("sessions.search", json!({"query": "\"the capy\"*"})).await.unwrap();
    assert_eq!(phrase["results"][0]["sessionKey"], "agent:main:other", "{phrase}");
    let scoped = c.request("sessions.search", json!({"query": "capybara", "sessionKeys": ["main"]})).await.unwrap();
    assert_eq!(scoped["results"], json!([]));

    // Archived: hidden unless asked for.
    c.request("sessions.patch", json!({"key": "agent:main:other", "archived": true})).await.unwrap();
    let hidden = c.request("sessions.search", json!({"query": "capybara"})).await.unwrap();
    assert_eq!(hidden["results"], json!([]));
    let shown = c.request("sessions.search", json!({"query": "capybara", "scope": {"archived": true}})).await.unwrap();
    assert_eq!(shown["results"][0]["archived"], true);

    // Bad input names the problem.
    for (params, why) in [
        (json!({"query": "  "}), "query must not be empty"),
        (json!({"query": "\"\""}), "no words to search for"),
        (json!({"query": "x", "limit": 0}), "limit must be"),
        (json!({}), "missing field `query`"),
    ] {
        let e = c.request("sessions.search", params.clone()).await.expect_err("refused");
        assert!(e["message"].as_str().unwrap().contains(why), "{params}: {e}");
    }

    // A read-only connection may search and export.
    let mut params = connect_params(TOKEN);
    params["scopes"] = json!(["operator.read"]);
    let mut ro = Client::connect_with(&gw.addr, params).await.unwrap();
    assert_eq!(
        ro.request("sessions.search", json!({"query": "axolotl"})).await.unwrap()["results"].as_array().unwrap().len(),
        2
    );
    let md = ro.request("sessions.export", json!({"sessionKey": "main", "format": "md"})).await.unwrap();
    assert_eq!(md["mimeType"], "text/markdown; charset=utf-8");
    assert!(md["content"].as_str().unwrap().contains("tell me about the axolotl please"));
    let e = ro
        .request("sessions.export", json!({"sessionKey": "agent:main:nope", "format": "md"}))
        .await
        .expect_err("unknown");
    assert!(e["message"].as_str().unwrap().contains("session not found"), "{e}");
    let e = ro.request("sessions.export", json!({"sessionKey": "main", "format": "pdf"})).await.expect_err("format");
    assert!(e["message"].as_str().unwrap().contains("not one of html, md, jsonl"), "{e}");

    // HTTP: behind the token; the JSONL is the file on disk; the HTML embeds it.
    let url = format!("http://{}/api/sessions/agent%3Amain%3Amain/export", gw.addr);
    assert_eq!(get(&format!("{url}?format=jsonl"), None).await.0, 401);
    assert_eq!(get(&format!("{url}?format=jsonl"), Some("wrong-token")).await.0, 401);
    let index: Value =
        serde_json::from_slice(&std::fs::read(gw.state_dir.join("agents/main/sessions/sessions.json")).unwrap())
            .unwrap();
    let file = gw
        .state_dir
        .join(format!("agents/main/sessions/{}.jsonl", index["agent:main:main"]["sessionId"].as_str().unwrap()));
    let (status, headers, body) = get(&format!("{url}?format=jsonl"), Some(TOKEN)).await;
    assert_eq!(status, 200);
    assert_eq!(body, std::fs::read(&file).unwrap());
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
    assert!(header("content-disposition").starts_with("attachment; filename=\"pincer-"), "{headers:?}");
    let (status, headers, body) = get(&format!("{url}?format=html&token={TOKEN}"), None).await;
    assert_eq!(status, 200);
    assert!(headers.iter().any(|(k, v)| k == "content-security-policy" && v == "sandbox allow-scripts"), "{headers:?}");
    assert_eq!(pincer_export::import::extract(&body).unwrap(), std::fs::read(&file).unwrap());
    let (status, _, body) = get(&format!("{url}?format=html&leaf=nope"), Some(TOKEN)).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("entry not found"));
    let (status, _, _) =
        get(&format!("http://{}/api/sessions/agent%3Amain%3Aghost/export", gw.addr), Some(TOKEN)).await;
    assert_eq!(status, 400);

    // The index of the running gateway (the database and SQLite's journal files) is private.
    use std::os::unix::fs::PermissionsExt;
    let files: Vec<_> = std::fs::read_dir(gw.state_dir.join("search")).unwrap().flatten().collect();
    assert!(files.len() >= 2, "the database and its WAL: {files:?}");
    for f in files {
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600, "{:?}", f.path());
    }
}
